"""The drain fence wired into real runs (issue 7 acceptance): the real ``celeryops`` CLI as subprocesses, real
plugin workers (``celeryops_harness.fenceapp``) and plain ones, one real Redis for broker, fence and task records.

"Never executed" is read from the tasks' own start records (``ct:run:<id>``, Redis TIME), after a window in which
an unfenced worker would certainly have fetched (several plugin heartbeats with tasks waiting in the queue).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celeryops.demo.standins.cloudrun import CloudRunStandIn, cloud_run_env, standin_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops.demo.standins.workers import CeleryInstances
from celeryops.fence import FenceStore, PluginWorkerInfo, plugin_workers
from celeryops_harness import taskapp
from celeryops_harness.workers import WorkerProcess, wait_for
from clihelp import CliProcess, cli_env, run_cli
from drainhelp import enqueue, enqueue_hold, finished, runs, started
from e2ehelp import active_queues

pytestmark = pytest.mark.slow

FENCE_APP = "celeryops_harness.fenceapp"
PLUGIN = {"CELERYOPS_FENCE_INTERVAL": "0.3"}
FENCE_TTL = "3"
WAIT = 60.0  # generous: the machine is shared


def redis_time(client: redis.Redis) -> float:
    sec, usec = client.time()
    return float(sec) + float(usec) / 1e6


def wait_entry(client: redis.Redis, worker: WorkerProcess, what: str,
               cond: Callable[[PluginWorkerInfo], bool]) -> PluginWorkerInfo:
    """Wait until the worker's own registry heartbeat satisfies ``cond``."""

    def check() -> PluginWorkerInfo | None:
        info = plugin_workers(client).get(worker.nodename)
        return info if info is not None and cond(info) else None

    found = wait_for(check, WAIT, f"{worker.nodename}: {what}")
    assert isinstance(found, PluginWorkerInfo)
    return found


def held_for_a_while(client: redis.Redis, worker: WorkerProcess, queue: str) -> PluginWorkerInfo:
    """The worker reports the fence holding ``queue``, then three more heartbeats pass (a window to fetch in)."""
    held = wait_entry(client, worker, "held", lambda i: i.state == "held" and queue in i.held_queues)
    return wait_entry(client, worker, "three more heartbeats while held",
                      lambda i: i.beats >= held.beats + 3 and i.state == "held")


def beats_after(client: redis.Redis, worker: WorkerProcess, seen: PluginWorkerInfo, n: int) -> PluginWorkerInfo:
    """Wait until ``n`` more heartbeats than ``seen`` (so the plugin has applied what it read at least once)."""
    return wait_entry(client, worker, f"{n} more heartbeats", lambda i: i.beats >= seen.beats + n)


def still_held_after_beats(client: redis.Redis, worker: WorkerProcess, queue: str, beats: int = 3) -> None:
    """Three more heartbeats of the worker pass, and it still reports the fence holding ``queue``."""
    later = beats_after(client, worker, wait_entry(client, worker, "a heartbeat", lambda i: True), beats)
    assert later.state == "held" and queue in later.held_queues, later


def consuming(app: Celery, workers: list[WorkerProcess]) -> dict[str, set[str]]:
    return active_queues(app, [w.nodename for w in workers])


@pytest.fixture
def app(redis_url: str) -> Iterator[Celery]:
    control = Celery("celeryops_test_fence_drain", broker=redis_url)
    control.conf.broker_connection_retry_on_startup = True
    yield control
    control.close()


@pytest.fixture
def env(tmp_path: Path, redis_url: str) -> dict[str, str]:
    return cli_env(tmp_path / "state", CELERYOPS_REDIS_URL=redis_url, CELERYOPS_FENCE_TTL=FENCE_TTL)


def test_worker_started_mid_drain_runs_nothing_until_abort(redis_url: str, redis_client: redis.Redis, app: Celery,
                                                           start_workers: Any, queue_name: str,
                                                           env: dict[str, str]) -> None:
    """The drain re-broadcasts only every 2 s, so a late worker without the plugin would fetch the waiting tasks at
    once; the plugin worker fetches nothing during the drain, nor after the drained verdict (the run stays open
    and holds the fleet), until ``celeryops abort`` ends the run."""
    (first,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name], env=PLUGIN)
    (busy,) = enqueue_hold(redis_url, queue_name, queue_name)  # holds the drain open until the late worker is seen
    wait_for(lambda: started(redis_client, [busy]), WAIT, "the long task to start")
    drain = CliProcess(["drain", "--broker", redis_url, "-Q", queue_name, "--interval", "2", "--streak", "1",
                        "--json"], env)
    try:
        drain.wait_event("cancelled", WAIT)
        ids = enqueue(redis_url, queue_name, 0.2, n=4)
        (late,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name], env=PLUGIN)
        info = held_for_a_while(redis_client, late, queue_name)
        assert info.fence_run_id, info
        assert not started(redis_client, ids), "a task started on a worker that joined mid-drain"
        taskapp.release(redis_client, queue_name)
        drained = drain.wait_event("drained", WAIT)
        assert drain.finish() == 0, drain.read_stderr()
    finally:
        drain.kill()
    assert runs(redis_client, busy)["finished"] <= drained["_at"]

    # The drain process has ended but its run is open (phase drained): the fleet stays held past the fence TTL.
    store = FenceStore(redis_client)
    past_ttl = redis_time(redis_client) + float(FENCE_TTL)
    wait_for(lambda: redis_time(redis_client) > past_ttl, WAIT, "the fence TTL to pass after the drain exited")
    still_held_after_beats(redis_client, late, queue_name)
    assert not started(redis_client, ids), "a task started after the drained verdict, before the run ended"
    assert consuming(app, [first, late]) == {first.nodename: set(), late.nodename: set()}

    abort_at = redis_time(redis_client)
    result = run_cli(["abort", "--broker", redis_url], env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert store.read() is None, "abort must lift the fence"
    wait_for(lambda: len(finished(redis_client, ids)) == len(ids), WAIT, "the waiting tasks after the abort")
    assert all(runs(redis_client, t)["started"] >= abort_at for t in ids)
    assert all(runs(redis_client, t)["runs"] == 1 for t in ids)
    wait_for(lambda: consuming(app, [first, late]) == {first.nodename: {queue_name}, late.nodename: {queue_name}},
             WAIT, "both workers to consume again")


def test_killed_drain_plugin_workers_resume_alone_plain_ones_by_abort(redis_url: str, redis_client: redis.Redis,
                                                                      app: Celery, start_workers: Any,
                                                                      queue_name: str, env: dict[str, str]) -> None:
    (before, plain) = (
        start_workers(redis_url, app=FENCE_APP, queues=[queue_name], env=PLUGIN)[0],
        start_workers(redis_url, queues=[queue_name])[0],
    )
    assert consuming(app, [before, plain]) == {before.nodename: {queue_name}, plain.nodename: {queue_name}}
    # --streak 1000: this drain never ends by itself.
    drain = CliProcess(["drain", "--broker", redis_url, "-Q", queue_name, "--interval", "0.5", "--streak", "1000",
                        "--json"], env)
    try:
        drain.wait_event("cancelled", WAIT)
        (late,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name], env=PLUGIN)
        drain.wait_event("poll", WAIT, where=lambda e: late.nodename in e["workers"])
        everyone = [before, plain, late]
        wait_for(lambda: consuming(app, everyone) == {w.nodename: set() for w in everyone}, WAIT,
                 "every worker to stop consuming")
        held_for_a_while(redis_client, late, queue_name)
        drain.proc.kill()  # SIGKILL: no restore, no lift; the fence is simply no longer renewed
        assert drain.proc.wait(30) == -signal.SIGKILL
    finally:
        drain.kill()

    store = FenceStore(redis_client)
    fence = store.read()
    assert fence is not None and fence.ttl is not None
    expires_at = redis_time(redis_client) + fence.ttl
    ids = enqueue(redis_url, queue_name, 0.2, n=6)
    # The fence expires (nobody renews it); each plugin worker sees it gone and consumes again by itself, whether
    # the fence or the drain's cancel broadcast stopped it; the plain worker stays stopped.
    wait_for(lambda: store.read() is None, WAIT, "the fence to expire")
    for w in (before, late):
        gone = wait_entry(redis_client, w, "the fence gone", lambda i: not i.fence_run_id)
        beats_after(redis_client, w, gone, 2)
    assert consuming(app, everyone) == {before.nodename: {queue_name}, late.nodename: {queue_name},
                                        plain.nodename: set()}
    wait_for(lambda: len(finished(redis_client, ids)) == len(ids), WAIT, "the tasks on the resumed plugin workers")
    records = [runs(redis_client, t) for t in ids]
    assert all(r["started"] >= expires_at - 0.05 for r in records), "a task started before the fence expired"
    assert {r["worker"] for r in records} <= {before.nodename, late.nodename}

    result = run_cli(["abort", "--broker", redis_url], env)
    assert result.returncode == 0, result.stdout + result.stderr
    wait_for(lambda: consuming(app, everyone) == {w.nodename: {queue_name} for w in everyone}, WAIT,
             "the plain worker to consume again after the abort")


# --- during a deploy -------------------------------------------------------------------------------------------


class Rollout:
    """The Cloud Run stand-in's update hook: while the new revision rolls out (the hook blocks it), start one more
    worker of the OLD revision, one of the new revision (each with what Cloud Run sets in a service's instances)
    and one outside Cloud Run with CELERYOPS_VERSION = the sha, and record what each of them does with the tasks
    waiting in the queue."""

    def __init__(self, broker: str, queue: str, log_dir: Path, client: redis.Redis, sha: str) -> None:
        self.broker, self.queue, self.log_dir, self.client, self.sha = broker, queue, log_dir, client, sha
        self.workers: list[WorkerProcess] = []
        self.before: list[WorkerProcess] = []  # the old revision's workers from before the deploy
        self.tasks: list[str] = []
        self.seen: dict[str, Any] = {}
        self.error: BaseException | None = None
        self.done = threading.Event()

    def worker(self, **env: str) -> WorkerProcess:
        w = WorkerProcess(self.broker, app=FENCE_APP, queues=[self.queue], log_dir=self.log_dir,
                          env={**PLUGIN, "CELERYOPS_TEST_RECORD": self.broker, **env}).start()
        self.workers.append(w)
        return w

    def on_update(self, resource: str, revision: str, image: str) -> None:
        try:
            short = revision.rsplit("/", 1)[-1]
            self.seen["revision"] = short
            old = self.worker(**cloud_run_env("service", "worker", "worker-00001-old"))
            by_revision = self.worker(**cloud_run_env("service", "worker", short))
            by_version = self.worker(CELERYOPS_VERSION=self.sha)
            control = Celery("celeryops_test_rollout", broker=self.broker)
            try:
                for w in (old, by_revision, by_version):
                    w.wait_ready(control, timeout=WAIT)
            finally:
                control.close()
            for w in (by_revision, by_version):
                wait_entry(self.client, w, "consuming as the new release", lambda i: i.state == "consuming")
            wait_for(lambda: len(finished(self.client, self.tasks)) == len(self.tasks), WAIT,
                     "the waiting tasks to run on the new release")
            self.seen["old"] = held_for_a_while(self.client, old, self.queue)
            control = Celery("celeryops_test_rollout", broker=self.broker)
            try:
                self.seen["consuming"] = active_queues(control, [w.nodename for w in (*self.before, old)])
            finally:
                control.close()
            self.seen["fence"] = FenceStore(self.client).read()
            self.seen["runs"] = [runs(self.client, t) for t in self.tasks]
            self.seen["names"] = {"old": old.nodename, "new": {by_revision.nodename, by_version.nodename}}
        except BaseException as exc:  # reported by the test, not as a failed rollout
            self.error = exc
        finally:
            self.done.set()

    def stop(self) -> None:
        for w in self.workers:
            w.stop()


@pytest.fixture
def release(tmp_path: Path, redis_url: str, redis_client: redis.Redis, queue_name: str) -> Iterator[dict[str, Any]]:
    git = GitFixture(tmp_path / "git", branch="demo-7").create(commits=2, age=timedelta(days=1))
    registry = RegistryStandIn().start()
    sha = git.tip(git.remote)
    rollout = Rollout(redis_url, queue_name, tmp_path, redis_client, sha)
    standin = CloudRunStandIn(rollout_seconds=0.3, on_update=rollout.on_update)
    endpoint = standin.start()
    registry.seed("proj/worker", sha)
    standin.add_service("proj", "europe-west1", "worker", f"{registry.host}/proj/worker:old")
    (tmp_path / "celeryops.toml").write_text(standin_config(
        broker=redis_url, endpoint=endpoint, image=f"{registry.host}/proj/worker:{{sha}}"))
    yield {"git": git, "rollout": rollout, "dir": tmp_path, "sha": sha}
    rollout.stop()
    standin.stop()
    registry.stop()


def test_deploy_new_release_consumes_while_old_plugin_workers_stay_held(release: dict[str, Any], redis_url: str,
                                                                       redis_client: redis.Redis, app: Celery,
                                                                       start_workers: Any, queue_name: str) -> None:
    rollout: Rollout = release["rollout"]
    (old,) = start_workers(redis_url, app=FENCE_APP, queues=[queue_name],
                           env={**PLUGIN, **cloud_run_env("service", "worker", "worker-00001-old")})
    rollout.before.append(old)
    env = cli_env(release["dir"] / "state")
    proc = CliProcess(["deploy", "demo-7", "--yes", "--accept-warnings", "--json", "--repo",
                       str(release["git"].work)], env, cwd=release["dir"])
    try:
        checks = {}
        drained = None
        while drained is None:  # the fence check passes (every worker runs the plugin); queue tasks mid-drain
            event = proc.next_event(WAIT)
            assert event is not None, proc.read_stderr()
            if event["event"] == "check" and event["status"] != "running":
                checks[event["id"]] = event["status"]
            if event["event"] == "cancelled":
                rollout.tasks.extend(enqueue(redis_url, queue_name, 0.2, n=6))
            if event["event"] == "drained":
                drained = event
        assert checks.get("fence") == "ok", checks
        assert rollout.tasks, "no cancelled event before drained"
        proc.wait_event("deployed", 120)
        assert proc.finish() == 0, proc.read_stderr()
    finally:
        proc.kill()
    assert rollout.done.is_set()
    if rollout.error is not None:
        raise rollout.error
    seen = rollout.seen
    # While the new revision rolled out: the fence exempted it (by revision name and by sha) and it ran every
    # waiting task; the old revision's late worker stayed held by the same fence.
    fence = seen["fence"]
    assert fence is not None and seen["revision"] in fence.exempt_revisions
    assert release["sha"] in fence.exempt_versions
    assert {r["worker"] for r in seen["runs"]} <= seen["names"]["new"]
    assert all(r["runs"] == 1 and r["started"] > drained["_at"] for r in seen["runs"])
    assert seen["old"].state == "held" and seen["old"].held_queues == (queue_name,)
    assert seen["old"].revision == "worker-00001-old"
    assert seen["consuming"] == {old.nodename: set(), seen["names"]["old"]: set()}
    # The deploy is done: the fence is lifted.
    assert FenceStore(redis_client).read() is None


def test_deploy_to_a_worker_pool_exempts_the_new_revision_by_what_pools_set(tmp_path: Path, redis_url: str,
                                                                              redis_client: redis.Redis,
                                                                              queue_name: str) -> None:
    """A worker pool's instances carry CLOUD_RUN_WORKER_POOL_REVISION, not K_REVISION: the new revision's plugin
    workers are exempt from the drain's fence by it and consume at once (before the old ones are taken away), so
    the deploy ends without waiting for a consumer and without the "no worker consumes" warning."""
    git = GitFixture(tmp_path / "git", branch="demo-7").create(commits=2, age=timedelta(days=1))
    registry = RegistryStandIn().start()
    workers = CeleryInstances(redis_url, app=FENCE_APP, queues=[queue_name], log_dir=tmp_path,
                              env={**PLUGIN, "CELERYOPS_TEST_RECORD": redis_url})
    standin = CloudRunStandIn(rollout_seconds=0.3, launcher=workers)
    endpoint = standin.start()
    try:
        registry.seed("proj/worker", git.tip(git.remote))
        standin.add_worker_pool("proj", "europe-west1", "worker", f"{registry.host}/proj/worker:old", instances=2)
        (old,) = standin.instances("worker")
        (tmp_path / "celeryops.toml").write_text(standin_config(
            broker=redis_url, endpoint=endpoint, image=f"{registry.host}/proj/worker:{{sha}}",
            kind="cloudrun-worker-pool"))
        env = cli_env(tmp_path / "state", CELERYOPS_FENCE_TTL=FENCE_TTL)
        proc = CliProcess(["deploy", "demo-7", "--yes", "--accept-warnings", "--json", "--repo", str(git.work)], env,
                          cwd=tmp_path)
        try:
            done = proc.wait_event("deployed", 180)
            assert proc.finish() == 0, proc.read_stderr()
        finally:
            proc.kill()
        (new,) = standin.instances("worker")
        assert new != old and len(standin.instances("worker")[new]) == 2
        back = next(e for e in proc.events if e["event"] == "fleet")
        assert sorted(back["workers"]) == sorted(w.nodename for w in workers.alive(new))
        assert all(queues == [queue_name] for queues in back["workers"].values())
        assert not [e for e in proc.events if e["event"] == "notice" and "No worker consumes" in e["message"]]
        infos = [i for i in plugin_workers(redis_client).values() if i.revision == new]
        assert len(infos) == 2 and {i.cloudrun_kind for i in infos} == {"worker-pool"}
        (target,) = done["targets"]
        assert target["revision"] == new and "cloud_run_worker_pool" in target["logs_url"]
    finally:
        standin.stop()
        workers.stop()
        registry.stop()
