"""A Cloud Run worker pool on the stand-in whose instances are real fence-plugin Celery workers, a git remote and an
image registry: what an overlap deploy runs against in the tests (issue 19)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import redis

from celeryops.demo.standins.cloudrun import CloudRunStandIn, InstanceSpec, standin_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops.demo.standins.workers import CeleryInstances
from celeryops.fence import FenceStore
from celeryops_harness.stream import TaskStream
from celeryops_harness.taskapp import sleep
from celeryops_harness.workers import WorkerProcess, wait_for
from clihelp import cli_env
from drainhelp import finished

FENCE_APP = "celeryops_harness.fenceapp"
# Task events on, as on a worker started with -E (a canary credits outcomes from them; the harness's workers run
# without heartbeats, so `enable_events` alone could not turn them on).
PLUGIN = {"CELERYOPS_FENCE_INTERVAL": "0.3", "CELERYOPS_TEST_EVENTS": "1"}
WAIT = 90.0  # generous: the machine is shared
RELEASE = "demo-2"


@dataclass
class Pool:
    """The worker pool ``worker`` (``count`` instances of its first revision, ``old``) and what deploys it."""

    dir: Path
    redis_url: str
    queue: str
    git: GitFixture
    registry: RegistryStandIn
    workers: CeleryInstances
    standin: CloudRunStandIn
    sha: str
    old: str
    count: int
    env: dict[str, str] = field(default_factory=dict)
    strategy: str = "overlap"

    def args(self, *more: str) -> list[str]:
        return ["deploy", RELEASE, "--strategy", self.strategy, "--yes", "--accept-warnings", "--json", "--repo",
                str(self.git.work), *more]

    def instances(self) -> dict[str, int]:
        """Running instances by revision."""
        return {rev: len(found) for rev, found in self.standin.instances("worker").items()}

    def alive(self, revision: str | None = None) -> list[WorkerProcess]:
        return self.workers.alive(revision)  # type: ignore[return-value]

    def new_revision(self) -> str:
        names = [r.name.rsplit("/", 1)[-1] for r in self.standin.revisions("worker")]
        others = [n for n in names if n != self.old]
        assert others, names
        return others[-1]

    def fence(self) -> Any:
        client = redis.Redis.from_url(self.redis_url, decode_responses=True)
        try:
            return FenceStore(client).read()
        finally:
            client.close()


def toml_table(name: str, values: dict[str, object]) -> str:
    """``[name]`` with ``values`` (numbers, strings, lists of strings) as TOML."""
    def value(v: object) -> str:
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list | tuple):
            return "[" + ", ".join(json.dumps(str(x)) for x in v) + "]"
        return repr(v)

    return f"\n[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in values.items())


def make_pool(tmp_path: Path, redis_url: str, queue: str, *, count: int = 2, max_wait: float = 60,
              interval: float = 0.4, plugin: bool = True, kind: str = "cloudrun-worker-pool",
              new_queues: list[str] | None = None, new_env: dict[str, str] | None = None,
              canary: dict[str, object] | None = None, strategy: str = "overlap", **env: str) -> Pool:
    """``new_queues``: what the instances of every later revision consume (default: ``queue``, as the first).
    ``new_env``: more environment for every instance of a later revision (``{"CELERYOPS_TEST_FAIL_RATE": "0.2"}``:
    a bad release). ``canary``: a ``[canary]`` table for celeryops.toml. ``strategy``: what :meth:`Pool.args`
    deploys with."""
    git = GitFixture(tmp_path / "git", branch=RELEASE).create(commits=2, age=timedelta(days=1))
    registry = RegistryStandIn().start()
    first: list[str] = []

    def options(spec: InstanceSpec) -> dict[str, object]:
        first.append(first[0] if first else spec.revision)
        if spec.revision == first[0]:
            return {}
        later: dict[str, object] = {"queues": new_queues} if new_queues is not None else {}
        if new_env:
            later["env"] = dict(new_env)
        return later

    workers = CeleryInstances(redis_url, app=FENCE_APP if plugin else "celeryops_harness.taskapp", queues=[queue],
                              log_dir=tmp_path, env={**PLUGIN, "CELERYOPS_TEST_RECORD": redis_url}, options=options,
                              default_names=plugin)  # every instance celery@<this host>, as on Cloud Run
    standin = CloudRunStandIn(rollout_seconds=0.3, launcher=workers)
    endpoint = standin.start()
    sha = git.tip(git.remote)
    registry.seed("proj/worker", sha)
    if kind == "cloudrun-worker-pool":
        standin.add_worker_pool("proj", "europe-west1", "worker", f"{registry.host}/proj/worker:old", instances=count)
    else:
        standin.add_service("proj", "europe-west1", "worker", f"{registry.host}/proj/worker:old", instances=count)
    (old,) = standin.instances("worker")
    (tmp_path / "celeryops.toml").write_text(standin_config(
        broker=redis_url, endpoint=endpoint, image=f"{registry.host}/proj/worker:{{sha}}", kind=kind,
        interval=interval, max_wait=max_wait) + (toml_table("canary", canary) if canary is not None else ""))
    pool = Pool(tmp_path, redis_url, queue, git, registry, workers, standin, sha, old, count, strategy=strategy)
    pool.env = cli_env(tmp_path / "state", CELERYOPS_FENCE_TTL="3", CELERYOPS_LEASE_TTL="2", **env)
    return pool


def close_pool(pool: Pool) -> None:
    pool.standin.stop()
    pool.workers.stop()
    pool.registry.stop()


@contextlib.contextmanager
def running_pool(tmp_path: Path, redis_url: str, queue: str, **kw: Any) -> Iterator[Pool]:
    """:func:`make_pool`, stopped (stand-ins and every worker) when the block ends."""
    pool = make_pool(tmp_path, redis_url, queue, **kw)
    try:
        yield pool
    finally:
        close_pool(pool)


class Producer(TaskStream):
    """A steady stream of short tasks (one every ``every`` seconds) until stopped; ``ids`` in send order. ``task``:
    what it sends (``sleep``; ``work`` fails on a bad release), with ``(seconds, "short")``."""

    def __init__(self, broker: str, queue: str, *, seconds: float = 0.05, every: float = 0.1,
                 task: Any = sleep) -> None:
        super().__init__(broker, queue, task, (seconds, "short"), every)


def all_finished(client: redis.Redis, ids: list[str], what: str) -> None:
    wait_for(lambda: len(finished(client, ids)) == len(ids), WAIT, what)


def events_of(stdout: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def steps(events: list[dict[str, Any]]) -> list[str]:
    return [e["step"] for e in events if e["event"] == "overlap" and e["step"] != "progress"]


def consumes(app: Any, names: list[str]) -> dict[str, list[str]]:
    """active_queues of ``names`` (those that answered)."""
    replies = app.control.inspect(destination=names, timeout=3, limit=len(names)).active_queues() or {}
    return {w: sorted(q["name"] for q in qs or []) for w, qs in replies.items()}


def wait_consuming(app: Any, workers: list[WorkerProcess], queue: str) -> None:
    names = [w.nodename for w in workers]
    wait_for(lambda: consumes(app, names) == {name: [queue] for name in names}, WAIT,
             f"{', '.join(names)} to consume {queue}")


def now() -> float:
    return time.time()


def wait_lease_orphaned(pool: Pool) -> None:
    """Until the killed run's lease (fleet ``default``) is orphaned or gone, read in Redis."""
    from celeryops.ops.fleetwide.lease import read_lease

    client = redis.Redis.from_url(pool.redis_url)
    try:
        def expired() -> bool:
            lease = read_lease(client, "default")
            return lease is None or lease.orphaned

        wait_for(expired, WAIT, "the killed run's lease to be orphaned", step=0.2)
    finally:
        client.close()
