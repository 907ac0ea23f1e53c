"""Watch mode is read-only on the wire: Redis MONITOR recorded while a watcher console (Pilot, read-only) follows
a live ``celeryops drain --json`` run in another process. The watcher's connections (named ``celeryops-watch``)
send no control command (no PUBLISH at all: on Redis every Celery broadcast is one) and no write; only reads."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops.console.app import ConsoleApp, make_app
from celeryops.console.screens.home import HomeScreen
from celeryops.console.widgets.status_bar import StatusBar
from celeryops.core.config import Config
from celeryops.core.errors import ReadOnlyRefused
from celeryops.ops.backend.console import open_backend
from celeryops.ops.fleetwide.publish import read_status
from celeryops.ops.run.wiring import WATCH_CLIENT_NAME
from celeryops_harness.taskapp import release
from celeryops_harness.workers import wait_for
from clihelp import CliProcess, cli_env
from drainhelp import enqueue_hold, started
from monitorhelp import READS, Monitor, owned_by


def watcher(redis_url: str, state_dir: Path, follow_interval: float) -> tuple[Any, ConsoleApp]:
    """A read-only backend for the fleet on ``redis_url`` and the watch console over it (close the backend after)."""
    app = Celery("watcher", broker=redis_url, set_as_current=False)
    backend = open_backend(app, Config(broker=redis_url), read_only=True, fleet_display="watched fleet",
                           state_dir=str(state_dir), follow_interval=follow_interval)
    return backend, make_app(backend, animate=False, poll_interval=0.3)


@pytest.mark.slow
async def test_watch_sends_no_control_command_and_writes_nothing(
        redis_url: str, redis_client: redis.Redis, start_workers: Any, queue_name: str, tmp_path: Path) -> None:
    (worker,) = start_workers(redis_url, queues=[queue_name])
    ids = enqueue_hold(redis_url, queue_name, queue_name)  # in flight until the watcher is done
    wait_for(lambda: started(redis_client, ids), 30, "the task to start")
    drain = CliProcess(["drain", "--broker", redis_url, "-Q", queue_name, "--interval", "0.3", "--max-wait", "120",
                        "--json"], cli_env(tmp_path / "operator"))
    monitor: Monitor | None = None
    try:
        drain.wait_event("poll", 60)
        wait_for(lambda: (s := read_status(redis_client, "default")) is not None and s.phase == "draining", 30,
                 "the drain to be published")
        monitor = Monitor(redis_url).start()
        backend, console = watcher(redis_url, tmp_path / "watcher", follow_interval=0.2)
        try:
            async with console.run_test(size=(120, 40)) as pilot:
                deadline = time.monotonic() + 60
                home = console.screen_stack[0]
                assert isinstance(home, HomeScreen)
                while not (console.model.progress is not None and len(console.model.inflight) >= 3
                           and home.fleet is not None and home.fleet.run is not None):
                    assert time.monotonic() < deadline, "the watcher never showed the live run"
                    await pilot.pause(0.05)
                assert home.fleet.run.phase == "draining"
                assert [w.name for w in home.fleet.workers] == [worker.nodename]
                assert console.model.progress.active == 1
                header = console.screen.query_one(StatusBar).render().plain
                assert "default @ watched fleet" in header, header  # which fleet's runs this watcher follows
                for key in ("S", "G", "X", "F", "R", "A", "B"):  # dangerous keys do nothing here
                    await pilot.press(key)
                    await pilot.pause()
                with pytest.raises(ReadOnlyRefused):
                    await backend.abort_run()
                with pytest.raises(ReadOnlyRefused):
                    await backend.proceed()
                with pytest.raises(ReadOnlyRefused):  # B's rollback is refused in the ops layer too
                    await backend.start_rollback("any-run", lambda event: None)
                await pilot.press("q")
            assert console.return_value == 0
        finally:
            await backend.close()
            backend.close_sync()
        monitor.stop()
        records = list(monitor.records)
    finally:
        if monitor is not None:
            monitor.stop()
        drain.signal()
        drain.finish(60)
        release(redis_client, queue_name)

    mine = owned_by(records, WATCH_CLIENT_NAME)
    assert mine, "no connection named celeryops-watch was seen"
    verbs = [str(r["command"]).split(" ", 1)[0].lower() for r in mine]
    # Positive control: the watcher was identified and really read the published status and the events stream.
    assert "hgetall" in verbs and "xrange" in verbs, verbs
    forbidden = sorted({v for v in verbs if v not in READS})
    sample = [r["command"] for r in mine if r["command"].split()[0].lower() in forbidden][:5]
    assert not forbidden, f"the watcher sent {forbidden}: {sample}"
    assert not any(r["command"].lower().startswith("client") and " kill" in r["command"].lower() for r in mine)
    # The recording itself saw the operator's control traffic and writes from other connections (it can fail).
    mine_ids = {id(r) for r in mine}
    others = [str(r["command"]).split(" ", 1)[0].lower() for r in records if id(r) not in mine_ids]
    assert "publish" in others and any(v in others for v in ("hset", "xadd", "set", "lpush", "evalsha"))


@pytest.mark.slow
async def test_watch_between_runs_lists_workers_with_reads_only(
        redis_url: str, start_workers: Any, queue_name: str, tmp_path: Path) -> None:
    """No run is live: the watcher lists the fleet's workers from kombu's pidbox bindings (SMEMBERS) and reads the
    published status, polling several times, and still sends no PUBLISH (no ping, no inspect) and writes nothing."""
    (worker,) = start_workers(redis_url, queues=[queue_name])
    monitor = Monitor(redis_url).start()
    try:
        backend, console = watcher(redis_url, tmp_path / "watcher", follow_interval=0.2)
        try:
            async with console.run_test(size=(120, 40)) as pilot:
                home = console.screen_stack[0]
                assert isinstance(home, HomeScreen)
                deadline = time.monotonic() + 60

                def sent(verb: str) -> int:
                    return sum(1 for r in owned_by(list(monitor.records), WATCH_CLIENT_NAME)
                               if str(r["command"]).lower().startswith(verb))

                # several polls, and the published status read (on a loaded machine it came after 4 listings)
                while not (home.fleet is not None and home.fleet.workers and sent("smembers") >= 4
                           and sent("hgetall") >= 1):
                    assert time.monotonic() < deadline, "the watcher never listed the worker and read the status"
                    await pilot.pause(0.1)
                assert home.fleet is not None and home.fleet.run is None
                assert [(w.name, w.observed) for w in home.fleet.workers] == [(worker.nodename, False)]
                await pilot.press("q")
        finally:
            await backend.close()
            backend.close_sync()
    finally:
        monitor.stop()
    mine = owned_by(list(monitor.records), WATCH_CLIENT_NAME)
    verbs = [str(r["command"]).split(" ", 1)[0].lower() for r in mine]
    assert "smembers" in verbs and "hgetall" in verbs, verbs  # it did read the worker list and the status
    forbidden = sorted({v for v in verbs if v not in READS})
    assert not forbidden, f"the idle watcher sent {forbidden}"
    assert "publish" not in verbs
