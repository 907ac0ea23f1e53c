"""The run journal: durable, write-ahead, validated phases, recovery computable from the journal alone."""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from celeryops.core.errors import UserError
from celeryops.ops.journal import PHASES, InvalidTransition, Journal, Phase, UnknownRun, journal_path, new_run_id
from celeryops.ops.journal import db as journal_db
from celeryops.ops.run.recovery import plan

# The documented transitions, written out independently of the module's table.
ALLOWED: set[tuple[str, str]] = {
    ("preflight", "stopping"), ("stopping", "draining"), ("draining", "drained"), ("drained", "deploying"),
    ("drained", "done"), ("deploying", "deployed"), ("deployed", "done"),
    # an overlap deploy (a worker pool): the new revision up, the old one drained, the cutover, or the retirement
    ("preflight", "overlapping"), ("overlapping", "stopping"), ("drained", "cutting_over"),
    ("cutting_over", "deployed"),
    *((p, "retiring") for p in ("overlapping", "stopping", "draining", "drained")), ("retiring", "overlapping"),
    # an autoscale step: a cohort added, or an idle cohort drained and its instances taken away
    ("preflight", "scaling"), ("drained", "scaling"), ("scaling", "done"),
    *((p, end) for p in ("preflight", "stopping", "draining", "drained", "deploying", "deployed", "overlapping",
                         "cutting_over", "retiring", "scaling")
      for end in ("aborted", "failed")),
}
PATHS: dict[str, list[Phase]] = {
    "preflight": [],
    "stopping": ["stopping"],
    "draining": ["stopping", "draining"],
    "drained": ["stopping", "draining", "drained"],
    "deploying": ["stopping", "draining", "drained", "deploying"],
    "deployed": ["stopping", "draining", "drained", "deploying", "deployed"],
    "done": ["stopping", "draining", "drained", "deploying", "deployed", "done"],
    "aborted": ["aborted"],
    "failed": ["failed"],
    "overlapping": ["overlapping"],
    "cutting_over": ["overlapping", "stopping", "draining", "drained", "cutting_over"],
    "retiring": ["overlapping", "stopping", "retiring"],
    "scaling": ["stopping", "draining", "drained", "scaling"],
}


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    return Journal(state_dir=tmp_path / "state")


def test_run_is_recorded_with_masked_broker_and_settings(journal: Journal) -> None:
    run = journal.create_run(fleet="prod", broker="redis://:s3cret@redis.internal:6379/0", release="v42",
                             settings={"queues": ["a"], "result_backend": "amqp://u:hunter2@mq//", "streak": 2})
    again = Journal(journal.path).get(run.id)
    assert again.broker == "redis://:***@redis.internal:6379/0"
    assert again.settings == {"queues": ["a"], "result_backend": "amqp://u:***@mq//", "streak": 2}
    assert (again.fleet, again.release, again.phase, again.outcome, again.pid) == ("prod", "v42", "preflight", None,
                                                                                    os.getpid())
    raw = journal.path.read_bytes() + Path(str(journal.path) + "-wal").read_bytes()
    assert b"s3cret" not in raw and b"hunter2" not in raw


def test_run_ids_are_sortable_and_distinct() -> None:
    ids = [new_run_id(1_700_000_000 + i) for i in range(3)]
    assert ids == sorted(ids)
    assert len({new_run_id(1_700_000_000) for _ in range(50)}) == 50


@pytest.mark.parametrize(("start", "target"), list(itertools.product(PHASES, PHASES)))
def test_transitions_are_validated(journal: Journal, start: Phase, target: Phase) -> None:
    run = journal.create_run(fleet="f", broker="redis://h")
    for step in PATHS[start]:
        journal.advance(run.id, step)
    if (start, target) in ALLOWED:
        assert journal.advance(run.id, target).phase == target
    else:
        with pytest.raises(InvalidTransition, match=f"from {start} to {target}.*left unchanged"):
            journal.advance(run.id, target)
        assert journal.get(run.id).phase == start


def test_drain_only_run_stays_open_and_terminal_phases_set_outcome(journal: Journal) -> None:
    drained = journal.create_run(fleet="f", broker="redis://h")
    for step in PATHS["drained"]:
        journal.advance(drained.id, step)
    deployed = journal.create_run(fleet="f", broker="redis://h")
    for step in PATHS["done"]:
        journal.advance(deployed.id, step)
    other_fleet = journal.create_run(fleet="g", broker="redis://h")
    aborted = journal.create_run(fleet="f", broker="redis://h")
    journal.advance(aborted.id, "aborted", reason="operator said no", outcome="aborted: declined")

    assert [r.id for r in journal.unfinished_runs("f")] == [drained.id]
    assert [r.id for r in journal.unfinished_runs()] == [drained.id, other_fleet.id]
    assert journal.get(deployed.id).outcome == "succeeded"
    assert journal.get(aborted.id).outcome == "aborted: declined"
    assert journal.get(aborted.id).records[-1].payload["reason"] == "operator said no"


def test_history_is_newest_first_with_duration(tmp_path: Path) -> None:
    clock = iter(float(t) for t in range(1000, 2000, 5))
    journal = Journal(state_dir=tmp_path, clock=lambda: next(clock))
    first = journal.create_run(fleet="f", broker="redis://h", release="v1")  # created 1000 (record 1005)
    journal.advance(first.id, "aborted")  # 1010
    second = journal.create_run(fleet="f", broker="redis://h", release="v2")
    rows = journal.history(limit=10)
    assert [r.id for r in rows] == [second.id, first.id]
    assert rows[1].release == "v1" and rows[1].outcome == "aborted" and rows[1].duration == 10.0
    assert [r.id for r in journal.history(limit=1)] == [second.id]


def test_stopped_consumers_follow_intents_and_settles(journal: Journal) -> None:
    run = journal.create_run(fleet="f", broker="redis://h")
    cancel = journal.intend_cancel_consumers(run.id, {"w1": ["a", "b"], "*": ["a"]}, before={"w1": ["a", "b", "c"]})
    # Not settled yet: we cannot know it did not happen, so it counts as stopped.
    assert journal.stopped_consumers(run.id) == {"w1": {"a", "b"}, "*": {"a"}}
    journal.settle(cancel, {"replies": 1})
    restore = journal.intend_add_consumers(run.id, {"w1": ["a"]})
    # A restore counts only once it is known to have happened.
    assert journal.stopped_consumers(run.id) == {"w1": {"a", "b"}, "*": {"a"}}
    journal.settle(restore, {"ok": False, "error": "no reply"})
    assert journal.stopped_consumers(run.id) == {"w1": {"a", "b"}, "*": {"a"}}
    journal.settle(journal.intend_add_consumers(run.id, {"w1": ["a"]}))
    assert journal.stopped_consumers(run.id) == {"w1": {"b"}, "*": {"a"}}
    journal.settle(journal.intend_add_consumers(run.id, {"*": ["a", "b"]}))
    assert journal.stopped_consumers(run.id) == {}
    # The generic intend() with a bare {worker: [queues]} map means the same.
    journal.intend(run.id, "cancel_consumers", {"celery@w2": ["c"]})
    assert journal.stopped_consumers(run.id) == {"celery@w2": {"c"}}
    journal.settle(journal.intend(run.id, "add_consumers", {"celery@w2": ["c"]}))
    assert journal.stopped_consumers(run.id) == {}
    assert journal.get(run.id).consumed_before() == {"w1": {"a", "b", "c"}}


def test_after_write_hook_sees_every_durable_write(tmp_path: Path) -> None:
    seen: list[str] = []
    journal = Journal(state_dir=tmp_path, after_write=seen.append)
    run = journal.create_run(fleet="f", broker="redis://h")
    journal.advance(run.id, "stopping")
    journal.settle(journal.intend_cancel_consumers(run.id, {"*": ["q"]}))
    journal.note(run.id, {"text": "hello"})
    assert seen == ["created", "phase", "phase:stopping", "intent:cancel_consumers", "settle:cancel_consumers",
                    "note"]


def test_unknown_ids_are_clear_errors(journal: Journal) -> None:
    with pytest.raises(UnknownRun, match="No run 'nope'"):
        journal.get("nope")
    with pytest.raises(UnknownRun):
        journal.intend("nope", "cancel_consumers", {})
    with pytest.raises(UnknownRun, match="No intent 999"):
        journal.settle(999)


async def test_async_api(journal: Journal) -> None:
    run = await journal.aio.create_run(fleet="f", broker="redis://h")
    await journal.aio.advance(run.id, "stopping")
    intent = await journal.aio.intend_cancel_consumers(run.id, {"w": ["q"]}, {"w": ["q"]})
    await journal.aio.settle(intent)
    assert await journal.aio.stopped_consumers(run.id) == {"w": {"q"}}
    assert [r.id for r in await journal.aio.unfinished_runs("f")] == [run.id]
    assert (await journal.aio.get(run.id)).phase == "stopping"
    assert len(await journal.aio.history()) == 1


CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from celeryops.ops.journal import Journal

    state, kill_at, effects = sys.argv[1], sys.argv[2], Path(sys.argv[3])

    def hook(kind):
        if kind == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    j = Journal(state_dir=state, after_write=hook)
    run = j.create_run(fleet="f", broker="redis://:pw@h/0", run_id="run-1")
    j.advance(run.id, "stopping")
    i = j.intend_cancel_consumers(run.id, {"w1": ["q1"], "*": ["q1"]}, {"w1": ["q1", "q2"]})
    effects.write_text("cancelled\\n")
    j.settle(i, {"replies": 1})
    j.advance(run.id, "draining")
    j.advance(run.id, "drained")
    i = j.intend_add_consumers(run.id, {"w1": ["q1"], "*": ["q1"]})
    with effects.open("a") as f:
        f.write("restored\\n")
    j.settle(i)
    j.advance(run.id, "aborted")
""")


@pytest.mark.parametrize(("kill_at", "effects", "phase", "stopped"), [
    ("phase", "", "stopping", {}),
    ("intent:cancel_consumers", "", "stopping", {"w1": {"q1"}, "*": {"q1"}}),
    ("intent:add_consumers", "cancelled\n", "drained", {"w1": {"q1"}, "*": {"q1"}}),
    ("settle:add_consumers", "cancelled\nrestored\n", "drained", {}),
])
def test_sigkill_between_record_and_side_effect(tmp_path: Path, kill_at: str, effects: str, phase: str,
                                                stopped: dict[str, set[str]]) -> None:
    """A real process is SIGKILLed by the hook right after a durable write, before the side effect it announces:
    the journal alone tells what may have happened, and recovery restores exactly that."""
    effects_file = tmp_path / "effects"
    effects_file.write_text("")
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "state"), kill_at, str(effects_file)],
                          capture_output=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert effects_file.read_text() == effects  # the side effect after the record never ran

    run = Journal(state_dir=tmp_path / "state").get("run-1")
    assert run.phase == phase
    assert run.stopped_consumers() == stopped
    recovery = plan(run, None)
    if stopped:
        assert recovery.action == "restore"
        assert recovery.restore == {w: sorted(q) for w, q in stopped.items()}
    else:
        assert recovery.action == "nothing" and recovery.restore == {}
    assert recovery.mark_as == "aborted"


def test_corrupt_journal_is_a_user_error_and_left_untouched(tmp_path: Path) -> None:
    path = journal_path(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    garbage = b"this is not sqlite\n" * 500
    path.write_bytes(garbage)
    with pytest.raises(UserError) as err:
        Journal(path)
    assert str(path) in str(err.value) and "move the file aside" in str(err.value)
    assert "\n" not in str(err.value)
    assert path.read_bytes() == garbage
    assert not Path(str(path) + "-wal").exists()


def _creator_mid_schema(path: Path) -> sqlite3.Connection:
    """A writer between SQLite creating the file (at connect) and its schema transaction's commit."""
    path.parent.mkdir(parents=True, exist_ok=True)
    creator = sqlite3.connect(path, isolation_level=None)
    creator.execute("PRAGMA journal_mode=WAL")
    creator.execute("BEGIN IMMEDIATE")
    creator.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    return creator


def test_a_reader_waits_for_a_journal_being_created_rather_than_calling_it_corrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's ``status`` (a read-only open) while another process creates the journal: the file is there,
    its schema not yet. The reader waits; here the creator finishes at the reader's first wait."""
    path = journal_path(tmp_path)
    creator = _creator_mid_schema(path)
    waits: list[float] = []
    real_sleep = time.sleep

    def wait(seconds: float) -> None:
        waits.append(seconds)
        if len(waits) == 1:
            creator.execute("ROLLBACK")
            creator.close()
            Journal(path).close()  # the real creator's schema, committed
        real_sleep(seconds)

    monkeypatch.setattr(time, "sleep", wait)
    with Journal(path, read_only=True) as reader:
        assert reader.unfinished_runs() == []
    assert waits, "the reader found the schema missing and waited for it"


def test_a_journal_whose_creator_never_wrote_it_is_called_empty_not_corrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = journal_path(tmp_path)
    creator = _creator_mid_schema(path)
    monkeypatch.setattr(journal_db, "CREATING_WAIT", 0.2)
    try:
        with pytest.raises(UserError, match=r"still empty after 0.2 s .*run the command again") as err:
            Journal(path, read_only=True)
    finally:
        creator.close()
    assert "corrupt" not in str(err.value) and "\n" not in str(err.value)


def test_damaged_sqlite_file_is_a_user_error(tmp_path: Path) -> None:
    journal = Journal(state_dir=tmp_path)
    run = journal.create_run(fleet="f", broker="redis://h")
    for i in range(200):
        journal.note(run.id, {"i": i, "pad": "x" * 200})
    journal.close()
    with sqlite3.connect(journal.path) as conn:  # fold the WAL into the main file, then damage its pages
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(journal.path.read_bytes())
    data[4096:4096 * 4] = b"\xff" * (4096 * 3)
    journal.path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"corrupt|cannot be opened"):
        Journal(journal.path).get(run.id)


def test_unwritable_state_dir_is_a_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    with pytest.raises(UserError, match=r"Cannot create the state directory .*not-a-dir/state.*--state-dir"):
        Journal(state_dir=blocker / "state")
    (tmp_path / "dir-as-journal" / "journal.sqlite3").mkdir(parents=True)
    with pytest.raises(UserError, match="is not a file"):
        Journal(state_dir=tmp_path / "dir-as-journal")


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    Journal(state_dir=tmp_path).close()
    with sqlite3.connect(journal_path(tmp_path)) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(UserError, match="newer celeryops"):
        Journal(state_dir=tmp_path)


def test_wal_and_full_sync(journal: Journal) -> None:
    with sqlite3.connect(journal.path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert journal._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
