"""Issue 3 acceptance, end to end: real redis-server, real Celery workers, the real CLI as subprocesses.

A ``celeryops drain`` is killed in every phase it can reach (SIGKILL through the journal's test hook, right after a
durable record), interrupted by SIGINT/SIGTERM/SIGHUP, raced by a second drain, resumed, and pointed at broken
journals; each time the workers must end up consuming exactly what they consumed before, checked with
active_queues on every worker. Workers consume different queue sets, so "exactly" also means "not more".
"""

from __future__ import annotations

import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celeryops.core.masking import mask_url
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.ops.fleetwide.lease import read_lease
from celeryops.ops.fleetwide.publish import read_events
from celeryops.ops.journal import Journal, journal_path
from celeryops_harness.taskapp import release
from celeryops_harness.workers import WorkerProcess, control_app, wait_for
from clihelp import CliProcess, cli_env, run_cli
from drainhelp import enqueue_hold, finished, runs, started
from e2ehelp import (
    SharedFleet,
    cli_json,
    dump_redis,
    journal_runs,
    one_sentence_error,
    only_run,
    parse_json,
    run_together,
)

pytestmark = pytest.mark.slow

FAST = ["--interval", "0.3", "--streak", "2"]
FOREVER = ["--interval", "0.3", "--streak", "100000"]  # never drained: stays in `draining` until stopped
LEASE_TTL = "2"  # seconds (CELERYOPS_LEASE_TTL, read by the Runner)
ORPHAN_DEADLINE = 60.0  # generous: covers the 30 s default TTL on a loaded machine


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedFleet]:
    """Two workers on a private redis-server: w1 consumes a+b, w2 consumes a+c."""
    server = RedisServer().start()
    tag = uuid.uuid4().hex[:6]
    qa, qb, qc = f"e2e-{tag}-a", f"e2e-{tag}-b", f"e2e-{tag}-c"
    logs = tmp_path_factory.mktemp("workers")
    env = {"CELERYOPS_TEST_RECORD": server.db_url(1)}
    workers = [
        WorkerProcess(server.url, queues=[qa, qb], name=f"w1-{tag}", env=env, log_dir=logs).start(),
        WorkerProcess(server.url, queues=[qa, qc], name=f"w2-{tag}", env=env, log_dir=logs).start(),
    ]
    app = control_app(server.url)
    try:
        for worker in workers:
            worker.wait_ready(app, timeout=60)
        fleet = SharedFleet(server=server, app=app, workers=workers,
                            baseline={workers[0].nodename: {qa, qb}, workers[1].nodename: {qa, qc}})
        assert fleet.consuming() == fleet.baseline
        yield fleet
    finally:
        for worker in workers:
            worker.stop()
        app.close()
        server.close()


@pytest.fixture
def fleet(shared: SharedFleet) -> SharedFleet:
    shared.reset()
    return shared


@pytest.fixture
def fleet_name() -> str:
    return f"e2e-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def env(tmp_path: Path, fleet_name: str) -> dict[str, str]:
    """This test's operator: its own state dir and fleet name (lease/status keys); coordination on the broker."""
    return cli_env(tmp_path / "state", CELERYOPS_FLEET=fleet_name, CELERYOPS_LEASE_TTL=LEASE_TTL)


@pytest.fixture
def records(shared: SharedFleet) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(shared.server.db_url(1), decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def coord(shared: SharedFleet) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(shared.url, decode_responses=True)
    yield client
    client.close()


def recorded_stops(fleet: SharedFleet) -> dict[str, list[str]]:
    """What a drain of every queue records: each worker's own queues, plus all of them by broadcast."""
    return {**{w: sorted(qs) for w, qs in fleet.baseline.items()}, "*": fleet.queues}


def status_args(fleet: SharedFleet) -> list[str]:
    return ["status", "--broker", fleet.url, "--json"]


def status(fleet: SharedFleet, env: dict[str, str]) -> dict[str, Any]:
    return dict(cli_json(["status", "--broker", fleet.url], env))


def fleet_keys(client: redis.Redis, name: str) -> list[str]:
    return sorted(client.scan_iter(match=f"celeryops:{{{name}}}:*"))


def wait_orphaned(client: redis.Redis, name: str, run_id: str) -> None:
    def orphaned() -> bool:
        lease = read_lease(client, name)
        assert lease is not None and lease.run_id == run_id, lease
        return lease.orphaned

    wait_for(orphaned, ORPHAN_DEADLINE, f"the lease of run {run_id} to expire", step=0.2)


def assert_no_current_run(after: dict[str, Any], run_id: str) -> None:
    """``status --json`` after the run ended: nothing current, the run last published as aborted, no lease left."""
    assert after["run"] is None and after["source"] is None and after["recovery"] is None, after
    assert after["last"] is not None and after["last"]["run_id"] == run_id and after["last"]["phase"] == "aborted"
    assert after["lease"] is None, f"the ended run still holds the fleet's lease: {after['lease']}"


# -- SIGKILL in every phase a drain reaches, then `celeryops abort` from a fresh process --------------------------

@pytest.mark.parametrize(("kill_after", "phase", "stopped"), [
    ("created", "preflight", False),
    ("phase:stopping", "stopping", False),
    ("intent:cancel_consumers", "stopping", False),  # recorded, not broadcast yet
    ("phase:draining", "draining", True),
    ("phase:drained", "drained", True),
])
def test_sigkill_in_each_phase_then_abort_restores_exactly(fleet: SharedFleet, env: dict[str, str],
                                                           fleet_name: str, coord: redis.Redis, kill_after: str,
                                                           phase: str, stopped: bool) -> None:
    drain = run_cli(["drain", "--broker", fleet.url, *FAST, "--json"], env, kill_after=kill_after)
    assert drain.returncode == -signal.SIGKILL, (drain.returncode, drain.stdout, drain.stderr)
    if stopped:  # broadcast before the kill: wait for a loaded worker to act on it (the drain would re-send it)
        wait_for(lambda: fleet.consuming() == fleet.all_stopped(), 30, "the broadcast stop to land", step=0.3)
    assert fleet.consuming() == (fleet.all_stopped() if stopped else fleet.baseline)

    run = only_run(env)
    assert run.phase == phase and run.outcome is None
    before = status(fleet, env)
    assert before["run"]["id"] == run.id and before["run"]["phase"] == phase, before
    assert before["run"]["in_local_journal"] is True
    if phase == "preflight":
        assert before["lease"] is None  # killed before it took the lease
    else:
        assert before["lease"]["run_id"] == run.id, before
    recovery = before["recovery"]
    if kill_after in ("created", "phase:stopping"):
        assert recovery["action"] == "nothing" and recovery["restore"] == {}, recovery
    else:
        # Write-ahead: even with the kill between the record and the broadcast, recovery knows what to undo.
        assert recovery["action"] == "restore" and recovery["restore"] == recorded_stops(fleet), recovery
        assert recovery["next"] == ["celeryops abort"]

    if before["lease"] is not None:
        wait_orphaned(coord, fleet_name, run.id)  # the killed owner's lease expires (TTL 2 s)
    abort = run_cli(["abort", "--broker", fleet.url, "--json"], env)
    assert abort.returncode == 0, abort.stderr
    assert fleet.consuming() == fleet.baseline  # exactly what each worker consumed before, not more
    ended = journal_runs(env["CELERYOPS_STATE_DIR"])[run.id]
    assert ended.phase == "aborted" and ended.outcome == "aborted" and ended.stopped_consumers() == {}
    assert_no_current_run(status(fleet, env), run.id)


def test_abort_after_a_one_queue_drain_gives_no_worker_a_queue_it_never_had(fleet: SharedFleet, env: dict[str, str],
                                                                           fleet_name: str, coord: redis.Redis) -> None:
    """Only w2 consumes c: a drain of c records w1 with nothing stopped. A restore from the journal must not take
    w1 for a worker that appeared since (those get the drained queues by broadcast) and make it consume c."""
    w1, w2 = (w.nodename for w in fleet.workers)
    (only_w2,) = fleet.baseline[w2] - fleet.baseline[w1]
    drain = run_cli(["drain", "--broker", fleet.url, "-Q", only_w2, *FAST, "--json"], env,
                    kill_after="phase:draining")
    assert drain.returncode == -signal.SIGKILL, (drain.returncode, drain.stdout, drain.stderr)
    # The stop was broadcast before the kill; a loaded worker may still be on its way to it (the drain would have
    # re-sent it at its next poll): wait for it to land rather than read the fleet in the same instant.
    stopped = {w1: fleet.baseline[w1], w2: fleet.baseline[w2] - {only_w2}}
    wait_for(lambda: fleet.consuming() == stopped, 30, f"{w2} to stop consuming {only_w2}", step=0.3)
    run = only_run(env)
    wait_orphaned(coord, fleet_name, run.id)
    abort = run_cli(["abort", "--broker", fleet.url, "--json"], env)
    assert abort.returncode == 0, abort.stderr
    assert fleet.consuming() == fleet.baseline  # w1 does not consume c: it never did


# -- SIGINT / SIGTERM / SIGHUP: the drain restores by itself --------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_in_draining_restores_and_exits_130(fleet: SharedFleet, env: dict[str, str], coord: redis.Redis,
                                                   fleet_name: str, sig: signal.Signals) -> None:
    drain = CliProcess(["drain", "--broker", fleet.url, *FOREVER, "--json"], env)
    try:
        drain.wait_event("poll", 60)
        assert fleet.consuming() == fleet.all_stopped()
        run = only_run(env)
        assert run.phase == "draining"
        drain.signal(sig)
        drain.wait_event("interrupted", 60)
        assert drain.finish() == 130
    finally:
        drain.kill()
    assert sig.name in drain.read_stderr()
    assert fleet.consuming() == fleet.baseline
    history, after = map(parse_json, run_together((["runs", "--json"], env), (status_args(fleet), env)))
    assert [(r["id"], r["phase"], r["outcome"]) for r in history] == [(run.id, "aborted", "aborted")]
    assert_no_current_run(after, run.id)
    assert read_lease(coord, fleet_name) is None  # released on the way out
    # Watchers saw it end: the outcome is published after the phase, in order.
    published = [(e.kind, e.data.get("phase") or e.data.get("event")) for e in read_events(coord, fleet_name)
                 if e.run_id == run.id and e.kind in ("phase", "finished")]
    assert published[-2:] == [("phase", "aborted"), ("finished", "interrupted")], published


# -- one run at a time -------------------------------------------------------------------------------------------

def test_second_drain_refused_then_take_over_after_sigkill(fleet: SharedFleet, env: dict[str, str], tmp_path: Path,
                                                           coord: redis.Redis, fleet_name: str) -> None:
    first = CliProcess(["drain", "--broker", fleet.url, *FOREVER, "--json"], env)
    other_state = tmp_path / "other-state"
    try:
        first.wait_event("poll", 60)
        run_id = only_run(env).id
        assert fleet.consuming() == fleet.all_stopped()
        # Another operator (another machine: its own journal), and the same operator again, at the same time.
        other_env = {**env, "CELERYOPS_STATE_DIR": str(other_state)}
        other, same = run_together((["drain", "--broker", fleet.url, *FAST], other_env),
                                   (["drain", "--broker", fleet.url, *FAST], env))
        line = one_sentence_error(other)  # refused by the lease, which names the holder and its age
        assert run_id in line and f"pid {first.proc.pid}" in line, line
        assert re.search(r"started (just now|.+ ago)", line), line  # the holder's age, whatever it is by now
        assert "nothing was done" in line or "nothing was changed" in line, line
        assert run_id in one_sentence_error(same)
        assert [r.id for r in journal_runs(str(other_state)).values() if not r.finished] == [], \
            "the refused drain left an open run in its journal"
        assert fleet.consuming() == fleet.all_stopped() and first.proc.poll() is None  # nothing changed
        lease = read_lease(coord, fleet_name)
        assert lease is not None and lease.run_id == run_id and not lease.orphaned
    finally:
        first.kill()  # SIGKILL: no restore, the lease stops beating

    wait_orphaned(coord, fleet_name, run_id)
    take = CliProcess(["drain", "--broker", fleet.url, *FAST, "--take-over", "--json"], env)
    try:
        take.wait_event("drained", 60)
        assert take.finish() == 0
    finally:
        take.kill()
    restored = [e for e in take.events if e["event"] == "restored"]
    assert restored and restored[0]["verified"], take.events  # recovery of the orphaned run came first
    history = journal_runs(env["CELERYOPS_STATE_DIR"])
    assert history[run_id].phase == "aborted"
    (new_id,) = set(history) - {run_id}
    outcome = [e.data.get("event") for e in read_events(coord, fleet_name)
               if e.run_id == new_id and e.kind == "finished"]
    assert outcome == ["drained"], outcome  # published for watchers, who have no other way to learn it
    assert history[new_id].phase == "drained" and history[new_id].outcome is None
    assert fleet.consuming() == fleet.all_stopped()  # the new run's drain holds them now
    assert run_cli(["abort", "--broker", fleet.url], env).returncode == 0
    assert fleet.consuming() == fleet.baseline


# -- resume -----------------------------------------------------------------------------------------------------

def test_resume_after_sigkill_in_draining_finishes_the_drain(fleet: SharedFleet, env: dict[str, str],
                                                             coord: redis.Redis, records: redis.Redis,
                                                             fleet_name: str) -> None:
    gate = fleet_name
    ids = enqueue_hold(fleet.url, fleet.queues[0], gate)  # runs until the resumed drain has seen it
    try:
        wait_for(lambda: started(records, ids), 30, "the task to start")
        drain = CliProcess(["drain", "--broker", fleet.url, *FAST, "--json"], env)
        try:
            drain.wait_event("poll", 60, where=lambda e: e["active"] > 0)
        finally:
            drain.kill()
        assert not finished(records, ids), "the task must still run when the drain is killed"
        run = only_run(env)
        assert run.phase == "draining"
        assert fleet.consuming() == fleet.all_stopped()

        wait_orphaned(coord, fleet_name, run.id)
        resume = CliProcess(["resume", "--broker", fleet.url, "--json"], env)
        try:
            resume.wait_event("poll", 60, where=lambda e: e["active"] > 0)
            release(records, gate)
            drained = resume.wait_event("drained", 60)
            assert resume.finish() == 0
        finally:
            resume.kill()
    finally:
        release(records, gate)  # the shared workers serve the next tests
    (tid,) = ids
    assert runs(records, tid)["finished"] <= drained["_at"] and runs(records, tid)["runs"] == 1
    history = journal_runs(env["CELERYOPS_STATE_DIR"])
    assert list(history) == [run.id]  # the same run went on, no new one
    assert history[run.id].phase == "drained" and history[run.id].outcome is None
    assert fleet.consuming() == fleet.all_stopped()
    now = status(fleet, env)
    assert now["run"]["id"] == run.id and now["run"]["phase"] == "drained"
    assert now["recovery"]["action"] == "restore" and now["recovery"]["restore"] == recorded_stops(fleet)
    assert run_cli(["abort", "--broker", fleet.url], env).returncode == 0
    assert fleet.consuming() == fleet.baseline


# -- broken journals and state dirs: one sentence, nothing done ----------------------------------------------------

def _break_corrupt(state: Path) -> Path:
    state.mkdir(parents=True)
    journal_path(state).write_bytes(b"this is not a sqlite database\n" * 300)
    return state


def _break_not_a_file(state: Path) -> Path:
    journal_path(state).mkdir(parents=True)
    return state


def _break_unopenable(state: Path) -> Path:
    state.mkdir(parents=True)
    journal_path(state).symlink_to(state / "missing-dir" / "journal.sqlite3")
    return state


def _break_state_dir_unwritable(state: Path) -> Path:
    # Running as root makes permission bits moot: a regular file in the path makes the dir impossible to create.
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text("a file where the state dir should be\n")
    return state / "celeryops"


@pytest.mark.parametrize(("breakage", "words", "commands"), [
    (_break_corrupt, "corrupt", ("drain", "abort", "resume")),
    (_break_not_a_file, "not a file", ("drain",)),
    (_break_unopenable, "cannot be opened", ("drain",)),
    (_break_state_dir_unwritable, "Cannot create the state directory", ("drain", "abort")),
], ids=["corrupt", "not-a-file", "unopenable", "state-dir-unwritable"])
def test_broken_journal_or_state_dir_touches_nothing(fleet: SharedFleet, env: dict[str, str], tmp_path: Path,
                                                     coord: redis.Redis, fleet_name: str, breakage: Any,
                                                     words: str, commands: tuple[str, ...]) -> None:
    state = breakage(tmp_path / "state")
    env = {**env, "CELERYOPS_STATE_DIR": str(state)}
    snapshot = sorted((str(p), p.is_dir() or p.read_bytes()) for p in tmp_path.rglob("*") if not p.is_symlink())
    results = run_together(*(([c, "--broker", fleet.url, *(FAST if c == "drain" else [])], env) for c in commands))
    for command, result in zip(commands, results, strict=True):
        line = one_sentence_error(result)
        assert words in line and "nothing was done" in line, (command, line)
    assert fleet.consuming() == fleet.baseline  # no consumer was touched
    assert fleet_keys(coord, fleet_name) == []  # no lease, no published status
    assert sorted((str(p), p.is_dir() or p.read_bytes()) for p in tmp_path.rglob("*")
                  if not p.is_symlink()) == snapshot  # the broken journal was left as it was


# -- no password anywhere -----------------------------------------------------------------------------------------

PASSWORD = "s3cret-pw"


def test_no_password_in_journal_redis_mirror_or_output(tmp_path: Path, start_workers: Any, queue_name: str) -> None:
    server = RedisServer(password=PASSWORD).start()
    app = control_app(server.url)
    client = redis.Redis.from_url(server.url)
    try:
        url = server.url
        assert PASSWORD in url
        (worker,) = start_workers(url, queues=[queue_name])
        state = tmp_path / "state"
        env = cli_env(state, CELERYOPS_FLEET="secret-fleet", CELERYOPS_LEASE_TTL=LEASE_TTL)
        outputs: list[str] = []

        def record(*results: Any) -> list[Any]:
            for result in results:
                outputs.extend([result.stdout, result.stderr])
            return list(results)

        # A drain (killed right after its `draining` record), what reads it in both formats, a refused second
        # drain, an unreachable broker given with the password, the recovery; then a full drain and its undo.
        (killed,) = record(run_cli(["drain", "--broker", url, *FAST, "--json"], env, kill_after="phase:draining"))
        assert killed.returncode == -signal.SIGKILL
        bad = url.replace(f"127.0.0.1:{server.port}", "127.0.0.1:1")
        reads = record(*run_together((["status", "--broker", url], env), (["status", "--broker", url, "--json"], env),
                                     (["runs", "--json"], env), (["drain", "--broker", url, *FAST, "--json"], env),
                                     (["drain", "--broker", bad, *FAST], env)))
        assert [r.returncode for r in reads] == [0, 0, 0, 5, 4], [r.stderr for r in reads]  # 5: lease held
        assert record(run_cli(["abort", "--broker", url, "--json"], env))[0].returncode == 0
        wait_for(lambda: getattr(read_lease(client, "secret-fleet"), "orphaned", True), ORPHAN_DEADLINE,
                 "the killed drain's lease to expire")
        (drained,) = record(run_cli(["drain", "--broker", url, *FAST, "--take-over"], env))
        assert drained.returncode == 0, drained.stderr
        assert record(run_cli(["abort", "--broker", url], env))[0].returncode == 0
        assert consuming_on(app, worker) == {queue_name}

        text = "\n".join(outputs)
        assert "redis://:***@127.0.0.1:" in text  # the outputs did name the broker, masked
        assert PASSWORD not in text

        with Journal(state_dir=state, read_only=True) as journal:
            history = journal.history()
            assert len(history) == 2
            assert all(journal.get(r.id).broker == mask_url(url) for r in history)
        for path in state.rglob("*"):
            assert PASSWORD.encode() not in path.read_bytes(), f"password in {path.name}"

        status_key, events_key = "celeryops:{secret-fleet}:status", "celeryops:{secret-fleet}:events"
        assert client.exists(status_key) and client.xlen(events_key) > 0  # the mirror is there to be grepped
        assert PASSWORD not in dump_redis(client)
    finally:
        client.close()
        app.close()
        server.close()


def consuming_on(app: Any, worker: WorkerProcess) -> set[str]:
    replies = app.control.inspect(destination=[worker.nodename], timeout=3, limit=1).active_queues() or {}
    return {q["name"] for q in replies.get(worker.nodename, [])}
