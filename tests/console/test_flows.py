"""The console over the real ops layer (``celeryops.ops.backend.console.OpsBackend``), driven by Pilot against a real
redis-server, real Celery workers and the local Cloud Run stand-in: preflight -> drain -> deploy -> done;
timeout -> consumers restored; quit mid-drain -> abort restores; detach leaves the run, and a restarted console
opens the resume/abort panel whose abort restores the consumers."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops.console.app import ConsoleApp, make_app
from celeryops.console.screens.confirm import ConfirmScreen
from celeryops.console.screens.deploy import DeployScreen
from celeryops.console.screens.quit import QuitScreen
from celeryops.console.screens.resume import ResumeScreen
from celeryops.core.config import Config, DrainSettings
from celeryops.core.configload import load_config
from celeryops.core.errors import EXIT_INTERRUPTED, EXIT_OK, EXIT_TIMEOUT
from celeryops.demo.standins.cloudrun import CloudRunStandIn, standin_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops.ops.backend.console import OpsBackend, open_backend
from celeryops.ops.journal import Journal
from celeryops.ops.run.session import DrainRequest
from celeryops_harness.taskapp import release
from celeryops_harness.workers import RevisionFleet, WorkerProcess, wait_for
from drainhelp import enqueue_hold, started

SIZE = (120, 40)
FAST = DrainSettings(interval=0.3, streak=2, max_wait=60.0)


def backend_for(broker: str, state: Path, **kw: Any) -> OpsBackend:
    app = Celery("celeryops-console-test", broker=broker, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False
    config = kw.pop("config", None) or Config(broker=broker)
    return open_backend(app, config, read_only=kw.pop("read_only", False), fleet_display="test fleet",
                        state_dir=str(state), **kw)


def console(backend: OpsBackend, **kw: Any) -> ConsoleApp:
    return make_app(backend, animate=False, poll_interval=3600.0, clock=time.time, **kw)


async def until(pilot: Any, cond: Callable[[], object], timeout: float, what: str) -> None:
    """Let the app run until ``cond()`` holds (the flows run in the app's loop)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            app = pilot.app
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; phase {app.model.phase}, "
                                 f"screen {type(app.screen).__name__}, log {[line.text for line in app.model.log]}")
        await pilot.pause(0.05)


async def press(pilot: Any, *keys: str) -> None:
    for key in keys:
        await pilot.press(key)
        await pilot.pause()


async def proceed(pilot: Any) -> None:
    """Preflight passed (maybe with warnings): G, then confirm."""
    app = pilot.app
    await until(pilot, lambda: app.model.may_proceed, 60, "the preflight to finish")
    await press(pilot, "G")
    await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
    await press(pilot, "y")


def consumed(broker: str, worker: WorkerProcess) -> list[str]:
    app = Celery("celeryops-check", broker=broker, set_as_current=False)
    try:
        replies = app.control.inspect(destination=[worker.nodename], timeout=3, limit=1).active_queues() or {}
    finally:
        app.close()
    return sorted(q["name"] for q in replies.get(worker.nodename, []))


async def consumed_async(broker: str, worker: WorkerProcess) -> list[str]:
    return await asyncio.to_thread(consumed, broker, worker)


@pytest.fixture
def busy_worker(redis_url: str, redis_client: redis.Redis, start_workers: Any, queue_name: str
                ) -> Iterator[Callable[[], WorkerProcess]]:
    """One real worker on ``queue_name`` running a recorded task that holds the drain open until the test ends
    (a task of N seconds may be over before a loaded machine reaches the step that needs the drain open)."""

    def make() -> WorkerProcess:
        (worker,) = start_workers(redis_url, queues=[queue_name])
        ids = enqueue_hold(redis_url, queue_name, gate=queue_name)
        wait_for(lambda: started(redis_client, ids), 30, "the task to start")
        return worker

    yield make
    release(redis_client, queue_name)  # before the workers stop: a cold shutdown need not wait for it


async def test_drain_timeout_restores_consumers(redis_url: str, busy_worker: Any, queue_name: str,
                                                tmp_path: Path) -> None:
    worker = busy_worker()
    settings = DrainSettings(interval=0.3, streak=2, max_wait=1.5)
    backend = backend_for(redis_url, tmp_path, drain=DrainRequest(queues=(queue_name,), settings=settings))
    app = console(backend, start="drain")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await proceed(pilot)
            await until(pilot, lambda: app.model.finished is not None, 60, "the drain to time out")
            assert app.model.phase == "aborted" and app.model.finished is not None
            assert app.model.finished.outcome == "timeout"
            assert any("restored" in line.text for line in app.model.log)
            await press(pilot, "q")
        assert app.return_value == EXIT_TIMEOUT
        assert await consumed_async(redis_url, worker) == [queue_name]
    finally:
        await backend.close()
        backend.close_sync()


async def test_quit_mid_drain_abort_restores_consumers(redis_url: str, busy_worker: Any, queue_name: str,
                                                      tmp_path: Path) -> None:
    worker = busy_worker()
    backend = backend_for(redis_url, tmp_path, drain=DrainRequest(queues=(queue_name,), settings=FAST))
    app = console(backend, start="drain")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await proceed(pilot)
            await until(pilot, lambda: app.model.progress is not None, 60, "the first drain poll")
            assert await consumed_async(redis_url, worker) == []  # stopped while the task runs
            await press(pilot, "q")
            assert isinstance(app.screen, QuitScreen)
            await press(pilot, "s")  # stay: nothing happens
            assert app.model.phase == "draining" and not isinstance(app.screen, QuitScreen)
            await press(pilot, "ctrl+c")  # same question
            assert isinstance(app.screen, QuitScreen)
            await press(pilot, "A")
            await until(pilot, lambda: app.return_value is not None, 60, "the abort to settle and the app to exit")
        assert app.return_value == EXIT_INTERRUPTED
        assert any("drain aborted from this console" in line.text for line in app.model.log), \
            "the operator's abort is named as such, not as an interruption"
        assert await consumed_async(redis_url, worker) == [queue_name]
        with Journal(state_dir=str(tmp_path)) as journal:
            assert journal.unfinished_runs() == []
    finally:
        await backend.close()
        backend.close_sync()


async def test_detach_then_restart_panel_abort_restores(redis_url: str, busy_worker: Any, queue_name: str,
                                                       tmp_path: Path) -> None:
    worker = busy_worker()
    backend = backend_for(redis_url, tmp_path, drain=DrainRequest(queues=(queue_name,), settings=FAST))
    app = console(backend, start="drain")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await proceed(pilot)
            await until(pilot, lambda: app.model.progress is not None, 60, "the first drain poll")
            await press(pilot, "q", "d")
            await until(pilot, lambda: app.return_value is not None, 30, "the console to detach")
        assert app.return_value == EXIT_INTERRUPTED
    finally:
        await backend.close()
        backend.close_sync()
    # Detached: the run is still open in the journal and its consumers stay stopped, for `celeryops resume`.
    with Journal(state_dir=str(tmp_path)) as journal:
        (run,) = journal.unfinished_runs()
        assert run.phase == "draining" and run.stopped_consumers()
    assert await consumed_async(redis_url, worker) == []

    backend = backend_for(redis_url, tmp_path)
    app = console(backend, start="home")
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, ResumeScreen), 20, "the resume/abort panel")
            assert isinstance(app.screen, ResumeScreen) and app.screen.run.run_id == run.id
            assert {c.kind for c in app.screen.run.choices} == {"resume", "abort"}
            await press(pilot, "X")
            assert isinstance(app.screen, ConfirmScreen)
            await press(pilot, "y")
            await until(pilot, lambda: not app.workers or all(w.is_finished for w in app.workers), 60,
                        "the abort to finish")
            await press(pilot, "q")
        assert app.return_value == EXIT_OK
        assert await consumed_async(redis_url, worker) == [queue_name]
        with Journal(state_dir=str(tmp_path)) as journal:
            assert journal.unfinished_runs() == []
    finally:
        await backend.close()
        backend.close_sync()


# -- preflight -> drain -> deploy -> done, against the Cloud Run stand-in -----------------------------------------


@pytest.mark.slow
async def test_deploy_preflight_drain_deploy_done(tmp_path: Path, redis_url: str, queue_name: str) -> None:
    git = GitFixture(tmp_path / "git", branch="demo-2").create(commits=2, age=timedelta(days=1))
    registry = RegistryStandIn().start()
    fleet = RevisionFleet(redis_url, queue_name, tmp_path)  # the service's instances: real workers
    standin = CloudRunStandIn(rollout_seconds=0.3, launcher=fleet)
    endpoint = standin.start()
    backend: OpsBackend | None = None
    try:
        registry.seed("proj/worker", git.tip(git.remote))
        standin.add_service("proj", "europe-west1", "worker", f"{registry.host}/proj/worker:old", instances=0)
        fleet.attach(standin, "worker")
        toml = tmp_path / "celeryops.toml"
        toml.write_text(standin_config(broker=redis_url, endpoint=endpoint, interval=0.3,
                                       image=f"{registry.host}/proj/worker:{{sha}}"))
        config = load_config(str(toml), tmp_path, {}, {"state_dir": str(tmp_path / "state")})
        fleet.start(1)
        backend = backend_for(redis_url, tmp_path / "state", config=config, repo=git.work)
        app = console(backend, start="deploy", release="demo-2")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: app.model.preflight is not None, 60, "the preflight")
            checks = {c.id: c.status for c in app.model.checks.values()}
            assert checks["image"] == "ok" and checks["permissions"] == "ok", checks
            await proceed(pilot)
            await until(pilot, lambda: app.model.phase == "done", 120, "the deploy to finish")
            assert isinstance(app.screen, DeployScreen)
            assert app.model.finished is not None and app.model.finished.outcome == "drained"
            assert [t.state for t in app.model.targets] == ["ready"]
            assert app.model.fleet_back and app.model.fleet_back[0].queues == (queue_name,)
            await press(pilot, "q")
        assert app.return_value == EXIT_OK
        assert fleet.replaced.is_set()
        with Journal(state_dir=str(tmp_path / "state")) as journal:
            assert journal.unfinished_runs() == []
    finally:
        if backend is not None:
            await backend.close()
            backend.close_sync()
        fleet.stop()
        standin.stop()
        registry.stop()


@pytest.mark.slow
@pytest.mark.parametrize("kill_after", ["phase:drained", "settle:deploy_start"])
async def test_console_resume_finishes_an_interrupted_deploy_as_the_cli_does(
        tmp_path: Path, redis_url: str, queue_name: str, kill_after: str) -> None:
    """A `celeryops deploy` SIGKILLed after its drain (or right after the update was accepted); the console's
    resume panel resumes it: drain again and deploy (or, the rollout being ready, finish), as `celeryops resume`."""
    from celeryops.ops.fleetwide.lease import read_lease
    from clihelp import cli_env, run_cli

    git = GitFixture(tmp_path / "git", branch="demo-2").create(commits=2, age=timedelta(days=1))
    registry = RegistryStandIn().start()
    fleet = RevisionFleet(redis_url, queue_name, tmp_path)  # the service's instances: real workers
    standin = CloudRunStandIn(rollout_seconds=0.3, launcher=fleet)
    endpoint = standin.start()
    backend: OpsBackend | None = None
    try:
        registry.seed("proj/worker", git.tip(git.remote))
        standin.add_service("proj", "europe-west1", "worker", f"{registry.host}/proj/worker:old", instances=0)
        fleet.attach(standin, "worker")
        (tmp_path / "celeryops.toml").write_text(standin_config(broker=redis_url, endpoint=endpoint, interval=0.3,
                                                                image=f"{registry.host}/proj/worker:{{sha}}"))
        (old,) = fleet.start(1)
        env = cli_env(tmp_path / "state", CELERYOPS_LEASE_TTL="1")
        killed = await asyncio.to_thread(
            run_cli, ["deploy", "demo-2", "--yes", "--accept-warnings", "--json", "--repo", str(git.work)], env,
            cwd=tmp_path, kill_after=kill_after)
        assert killed.returncode == -signal.SIGKILL, killed.stdout[-1500:] + killed.stderr[-1500:]
        client = redis.Redis.from_url(redis_url)
        await asyncio.to_thread(wait_for, lambda: (lease := read_lease(client, "default")) is None or lease.orphaned,
                                30, "the killed run's lease to be orphaned")
        client.close()
        config = load_config(str(tmp_path / "celeryops.toml"), tmp_path, {}, {"state_dir": str(tmp_path / "state")})
        backend = backend_for(redis_url, tmp_path / "state", config=config, repo=git.work)
        app = console(backend)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, ResumeScreen), 30, "the resume/abort panel")
            assert app.screen.run.kind == "deploy" and app.screen.run.release == "demo-2"
            await press(pilot, "R")
            await until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
            await press(pilot, "y")
            await until(pilot, lambda: app.model.result is not None, 120, "the resumed run to finish")
            assert app.model.result is not None and app.model.result.outcome == "deployed", app.model.result
            assert app.model.phase == "done" and isinstance(app.screen, DeployScreen)
            assert app.model.fleet_back and app.model.fleet_back[0].queues == (queue_name,)
            await press(pilot, "q")
        assert app.return_value == EXIT_OK
        assert fleet.replaced.is_set() and old not in fleet.workers[-1:]
        assert await consumed_async(redis_url, fleet.workers[-1]) == [queue_name]
        with Journal(state_dir=str(tmp_path / "state")) as journal:
            assert journal.unfinished_runs() == []
    finally:
        if backend is not None:
            await backend.close()
            backend.close_sync()
        fleet.stop()
        standin.stop()
        registry.stop()
