"""Which workers a broker reconnect stranded after a restore (``ops/run/stranded.py``): the journal of a real run
(SQLite) and what each worker consumes now. The end-to-end story, with a real Redis restart and a plain worker, is
in ``test_interrupted_e2e.py``."""

from __future__ import annotations

from pathlib import Path

from celeryops.ops.journal import Journal, Run
from celeryops.ops.run.stranded import last_restore, stranded


def ended_run(tmp_path: Path, restored: dict[str, list[str]], missing: dict[str, list[str]]) -> Run:
    """A run that stopped q1 on w1, w2 and w3, then restored them: ``restored`` / ``missing`` as the restore saw it
    (a worker in neither was left out as gone)."""
    with Journal(tmp_path / "journal.sqlite3") as journal:
        run = journal.create_run(fleet="f", broker="redis://x")
        journal.advance(run.id, "stopping")
        stops = {"w1": ["q1"], "w2": ["q1"], "w3": ["q1"], "*": ["q1"]}
        journal.settle(journal.intend_cancel_consumers(run.id, stops, {w: ["q1"] for w in ("w1", "w2", "w3")}))
        intent = journal.intend_add_consumers(run.id, stops)
        journal.settle(intent, {"ok": not missing, "restored": restored, "missing": missing})
        journal.advance(run.id, "aborted")
        return journal.get(run.id)


def test_a_worker_that_answers_and_consumes_nothing_is_stranded(tmp_path: Path) -> None:
    run = ended_run(tmp_path, {"w1": ["q1"], "w2": ["q1"]}, {})
    back = last_restore(run)
    assert back is not None and back[0] == {"w1": ("q1",), "w2": ("q1",), "w3": ("q1",)}
    found = stranded(run, {"w1": (), "w2": ("q1",)})  # w3 did not answer: nothing is said about it
    assert [(s.worker, s.queues, s.run_id) for s in found] == [("w1", ("q1",), run.id)]
    # a worker the restore left out as gone, back now and consuming nothing, is stranded too
    assert [s.worker for s in stranded(run, {"w1": ("q1",), "w3": ()})] == ["w3"]
    # one that consumes anything is not: an operator may have changed its queues since
    assert stranded(run, {"w1": ("other",), "w2": ("q1",), "w3": ("q1",)}) == ()


def test_an_open_run_or_one_without_a_restore_strands_nobody(tmp_path: Path) -> None:
    with Journal(tmp_path / "journal.sqlite3") as journal:
        run = journal.create_run(fleet="f", broker="redis://x")
        journal.advance(run.id, "aborted")
        assert last_restore(journal.get(run.id)) is None
        assert stranded(journal.get(run.id), {"w1": ()}) == ()
    assert stranded(None, {"w1": ()}) == ()
