"""The demo sandbox: every part ``celeryops demo`` needs, on loopback, started in order and torn down on exit.

``strategy="overlap"`` (``celeryops demo --strategy overlap``) makes the ``worker`` target a Cloud Run worker pool whose
workers all run the fence plugin (what an overlap deploy requires), with ``strategy = "overlap"`` in its config and no
autoscaler (a worker pool runs its manual instance count). ``autoscale=True`` (``celeryops demo --autoscale``) makes it
a worker pool sized by the real ``celeryops autoscale`` (:class:`~celeryops.demo.poolscaler.PoolScaler`, an
``[autoscale]`` table in the config), deployed with any strategy (each deploys the autoscaler's cohorts).

Parts: a private Redis (:class:`~celeryops.demo.broker.DemoRedis`: ``redis-server`` or the fakeredis fallback, whose
:attr:`Sandbox.notice` the console shows), the Cloud Run stand-in as the ``worker`` target whose instances are real
Celery workers (:class:`~celeryops.demo.fleet.DemoFleet`, the fence plugin on some of them; a deploy starts the new
revision's workers, then takes the old ones away), a :class:`~celeryops.demo.producer.Producer` and an
:class:`~celeryops.demo.autoscaler.Autoscaler`, the registry stand-in holding the release's image, and a git
repository whose remote has the release branch ``demo-2`` (fresh) and ``demo-1`` (40 days old: the freshness
warning).

A ``celeryops.toml`` in the sandbox directory points at all of it (:attr:`Sandbox.config`), and the process
environment is narrowed to the sandbox (``CELERYOPS_STATE_DIR``, ``CELERYOPS_FLEET``; every other ``CELERYOPS_*`` /
``CELERY_*`` variable is removed while the sandbox runs), so nothing touches the user's real fleet or state.

Teardown (:meth:`Sandbox.stop`, idempotent; also registered with ``atexit``) kills every child process group; a
:class:`~celeryops.demo.reaper.Reaper` process kills them if this process dies before it could.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import TracebackType

import redis

from celeryops.core.config import DEFAULT_STRATEGY, STRATEGY_KINDS, Config
from celeryops.core.configload import load_config
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.demo.autoscaler import Autoscaler
from celeryops.demo.broker import DemoRedis
from celeryops.demo.fleet import DemoFleet
from celeryops.demo.poolscaler import PoolScaler
from celeryops.demo.producer import Producer
from celeryops.demo.reaper import Reaper
from celeryops.demo.standins.cloudrun import CloudRunStandIn, standin_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops.demo.timing import Timing

log = logging.getLogger("celeryops.demo")

RELEASE = "demo-2"
STALE_RELEASE = "demo-1"
FLEET = "demo"
PROJECT = "demo-project"
REGION = "europe-west1"
SERVICE = "worker"
IMAGE_NAME = "demo/worker"
HINT = (f"Press D and Enter to deploy release {RELEASE} · w watches the run · r runs · s slots · ? every action · "
        "no pause: celeryops demo --strategy overlap")
AUTOSCALE_HINT = ("The worker pool is sized by celeryops autoscale: press a for its demand against capacity, cohorts "
                  f"and decisions · D and Enter deploys {RELEASE}{{how}} (it waits for a step in progress) · ? every "
                  "action.")
SLOT_TOTALS = {"CPU": 4, "GPU": 1}
#: The demo's ``[canary]`` table: its good release is judged and promoted in about a minute and a half at the demo's
#: pace (speed 1: a task every 1.5 s, a third of them on the canary, ~0.2-0.3 canary tasks/s on a loaded machine).
#: With no failure, 20 canary tasks bound the increase of the failure rate at 11.9 % (95 % one-sided), below the
#: 15 % margin; the defaults (50 tasks, 5 %) need 52 flawless canary tasks, about four minutes here.
DEMO_CANARY_TABLE = """
[canary]                 # the demo's, to decide at its pace; the defaults (50 tasks, 5 %) need more tasks
min_tasks = 20
margin = 0.15
look_interval = "2s"
max_duration = "5m"
instances = 1
"""
DEMO_HOST = "demo-node"

Progress = Callable[[str], None]


@dataclass(frozen=True)
class DemoHandoff:
    """What the console needs to open on the sandbox (see ``celeryops.commands.demo.open_console``)."""

    config: Config  # broker, state_dir, drain settings and the ``worker`` target, all pointing at the sandbox
    config_path: Path  # the sandbox's celeryops.toml
    repo: Path  # the git checkout of the release (``--repo`` of ``celeryops deploy``)
    release: str  # what D deploys
    broker_url: str
    state_dir: Path
    notice: str  # for the header: "" unless the Redis is the fakeredis fallback
    hint: str  # the home view's hint line


class Sandbox:
    """Start with ``start()`` (or ``with Sandbox(...) as sb``); stop with ``stop()``. ``progress`` receives one
    line per part started (for a readable startup); ``root`` defaults to a fresh temporary directory."""

    def __init__(self, timing: Timing | None = None, *, workers: int = 2, cap: int = 3, root: Path | None = None,
                 keep: bool = False, progress: Progress | None = None, strategy: str = DEFAULT_STRATEGY,
                 autoscale: bool = False) -> None:
        self.timing = timing or Timing()
        self.autoscale = autoscale  # a worker pool sized by `celeryops autoscale` (PoolScaler)
        # A strategy that runs on worker pools only (overlap, canary): the ``worker`` target is a Cloud Run worker pool
        # whose workers all run the fence plugin (no autoscaler: a worker pool runs its manual instance count).
        self.strategy = strategy
        self.initial_workers = workers
        self.cap = max(cap, workers)
        self._root = Path(root) if root is not None else None  # None: a temporary directory, made by start()
        self._own_root = root is None
        self.keep = keep
        self.progress = progress or (lambda line: None)
        self.reaper = Reaper()
        self.redis = DemoRedis()
        self.git: GitFixture | None = None
        self.registry: RegistryStandIn | None = None
        self.standin: CloudRunStandIn | None = None
        self.fleet: DemoFleet | None = None
        self.producer: Producer | None = None
        self.autoscaler: Autoscaler | None = None
        self.pool_scaler: PoolScaler | None = None
        self.sha = ""
        self._config: Config | None = None
        self._saved_env: dict[str, str] | None = None
        self._started = False
        self._stopped = False

    # -- facts the CLI and the console read ----------------------------------------------------------------------

    @property
    def root(self) -> Path:
        """The sandbox directory (config, state dir, worker logs, git repositories)."""
        assert self._root is not None, "the sandbox is not started"
        return self._root

    @property
    def directory(self) -> Path | None:
        """The sandbox directory, or None before ``start()`` made it."""
        return self._root

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def config_path(self) -> Path:
        return self.root / "celeryops.toml"

    @property
    def notice(self) -> str:
        """One sentence for the console's header when the demo runs on the fakeredis fallback, else ""."""
        return self.redis.notice

    @property
    def url(self) -> str:
        return self.redis.url

    @property
    def repo(self) -> Path:
        assert self.git is not None, "the sandbox is not started"
        return self.git.work

    @property
    def config(self) -> Config:
        assert self._config is not None, "the sandbox is not started"
        return self._config

    def handoff(self) -> DemoHandoff:
        return DemoHandoff(config=self.config, config_path=self.config_path, repo=self.repo, release=RELEASE,
                           broker_url=self.url, state_dir=self.state_dir, notice=self.notice,
                           hint=self._hint())

    def _hint(self) -> str:
        from celeryops.ops.run.strategies import strategy_named

        how = strategy_named(self.strategy).demo  # how the strategy says a deploy goes ("": the plain hint)
        if self.autoscale:
            return AUTOSCALE_HINT.replace("{how}", f" {how}" if how else "")
        return (f"Press D and Enter to deploy release {RELEASE} {how} · w watches the run · ? every action." if how
                else HINT)

    @property
    def overlap(self) -> bool:
        """The target is a worker pool (the strategy runs on worker pools only: two revisions side by side)."""
        return "cloudrun-service" not in STRATEGY_KINDS.get(self.strategy, ())

    @property
    def pool(self) -> bool:
        """The ``worker`` target is a Cloud Run worker pool whose workers all run the fence plugin."""
        return self.overlap or self.autoscale

    def env(self) -> dict[str, str]:
        """The variables the sandbox sets in this process (children inherit them)."""
        return {"CELERYOPS_STATE_DIR": str(self.state_dir), "CELERYOPS_FLEET": FLEET,
                "CELERYOPS_DEMO_SANDBOX": str(self.root)}

    def worker_env(self) -> dict[str, str]:
        env = {f"CELERYOPS_SLOTS_{kind}": str(n) for kind, n in SLOT_TOTALS.items()}
        env.update({
            "CELERYOPS_SLOTS_DETECT": "0",
            "CELERYOPS_SLOTS_HOST": DEMO_HOST,  # the demo's workers are one machine's: they share its pool
            "CELERYOPS_SLOTS_RETRY_COUNTDOWN": f"{self.timing.slot_retry:g}",
            "CELERYOPS_SLOTS_STARVATION_AFTER": f"{self.timing.scaled(60.0, floor=5.0):g}",
            "CELERYOPS_DEMO_FENCE_INTERVAL": f"{self.timing.fence_interval:g}",
        })
        return env

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def __enter__(self) -> Sandbox:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> Sandbox:
        """Start every part, in order; on any failure, stop what was started and re-raise."""
        if self._started:
            return self
        if shutil.which("git") is None:
            raise UserError("git is not on PATH, and the demo's release checks need a git repository: nothing was "
                            "started; install git and run the demo again.", EXIT_USAGE)
        self._started = True
        atexit.register(self.stop)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _narrow_env(self) -> None:
        self._saved_env = dict(os.environ)
        for key in list(os.environ):
            if key.startswith(("CELERYOPS_", "CELERY_")):
                del os.environ[key]
        os.environ.update(self.env())

    def _start(self) -> None:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="celeryops-demo-"))
        self.redis.log_dir = self.log_dir
        for folder in (self.root, self.state_dir, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self._narrow_env()
        self.reaper.start()
        self.redis.start()
        if self.redis.pid is not None:
            self.reaper.track(self.redis.pid)
        self.progress(f"{self.redis.kind} on {self.url}")

        self.git = self._make_git()
        self.progress(f"git remote with {RELEASE} (fresh) and {STALE_RELEASE} (40 days old): {self.git.remote}")
        self.registry = RegistryStandIn().start()
        self.registry.seed(IMAGE_NAME, self.sha)
        self.progress(f"registry stand-in on {self.registry.host} holding {IMAGE_NAME}:{self.sha[:7]}")

        self.fleet = DemoFleet(self.url, log_dir=self.log_dir, env=self.worker_env(), reaper=self.reaper,
                               cap=self.cap, all_fenced=self.pool)
        self.standin = CloudRunStandIn(rollout_seconds=self.timing.rollout, launcher=self.fleet.launch)
        endpoint = self.standin.start()
        self.progress(f"Cloud Run stand-in on {endpoint}")
        self._write_config(endpoint)
        self._config = load_config(str(self.config_path), self.root, self.env())

        # The service's (worker pool's) instances are the Celery workers: seeding it starts them (its first revision).
        add = self.standin.add_worker_pool if self.pool else self.standin.add_service
        add(PROJECT, REGION, SERVICE, f"{self.registry.host}/{IMAGE_NAME}:old", instances=self.initial_workers)
        self.fleet.attach(self.standin, SERVICE)
        kind = "worker pool" if self.pool else "service"
        self.progress(f"{PROJECT}/{REGION}/{SERVICE} ({kind}) runs {len(self.fleet.names())} Celery workers: "
                      f"{', '.join(self.fleet.names())}")
        self.producer = Producer(self.url, self.timing).start()
        if self.autoscale:
            self.pool_scaler = PoolScaler(self.url, self.config, self.progress).start()
            self.progress(f"producer running; celeryops autoscale sizes the worker pool (1 to {self.cap} instances)")
            return
        if self.overlap:  # a worker pool runs its manual instance count: no autoscaler
            from celeryops.ops.run.strategies import strategy_named

            peak = strategy_named(self.strategy).peak(self.initial_workers, self.config)
            self.progress(f"producer running; the worker pool runs {self.initial_workers} instances, "
                          f"{peak} at the {self.strategy}'s peak")
            return
        self.autoscaler = Autoscaler(self.fleet, self.url, every=self.timing.autoscale_every,
                                     on_scale=lambda name, depth: self.progress(
                                         f"autoscaler: {depth} messages waiting, started {name}")).start()
        self.progress(f"producer and autoscaler running (at most {self.cap} workers)")

    def _make_git(self) -> GitFixture:
        """``demo-1``: two commits 40 days old; ``demo-2``: two more, a day old; both pushed; work is on demo-2."""
        git = GitFixture(self.root / "git", branch=STALE_RELEASE).create(commits=2, age=timedelta(days=40))
        git.git(git.work, "checkout", "--quiet", "-b", RELEASE)
        git.commit(git.work, "faster exports", age=timedelta(days=1, hours=2))
        self.sha = git.commit(git.work, "retry GPU jobs on OOM", age=timedelta(days=1))
        git.push(git.work, RELEASE)
        git.git(git.work, "branch", "--quiet", f"--set-upstream-to=origin/{RELEASE}")
        return git

    def _write_config(self, endpoint: str) -> None:
        assert self.registry is not None
        t = self.timing
        text = standin_config(
            broker=self.url, endpoint=endpoint, image=f"{self.registry.host}/{IMAGE_NAME}:{{sha}}",
            interval=t.drain_interval, max_wait=t.drain_max_wait, project=PROJECT, region=REGION,
            resource=SERVICE, name=SERVICE, state_dir="state", branches="demo-*",
            kind="cloudrun-worker-pool" if self.pool else "cloudrun-service",
            comment=f"Written by `celeryops demo`: everything points at the sandbox in {self.root}.")
        if self.overlap:  # the target table is the file's last: its strategy goes at its end
            text += f'strategy = "{self.strategy}"\n'
        if self.autoscale:  # looks at the demo's pace; an idle cohort goes after 30 s (at speed 1)
            text += (f"\n[autoscale]\nmin_instances = 1\nmax_instances = {self.cap}\n"
                     f"interval = {t.autoscale_every:g}\nidle_after = {t.scaled(30.0, floor=2.0):g}\n"
                     f"drain_timeout = {t.drain_max_wait:g}\n")
        text += DEMO_CANARY_TABLE  # read by a canary only (the other strategies take no [canary] table into account)
        self.config_path.write_text(text, encoding="utf-8")

    def wait_busy(self, tasks: int = 2, timeout: float = 60.0) -> bool:
        """Wait until ``tasks`` demo tasks have started (so a drain has something to wait for)."""
        client = redis.Redis.from_url(self.url, socket_timeout=5)
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if int(client.get("demo:started") or 0) >= tasks:
                    return True
                time.sleep(0.1)
            return False
        finally:
            client.close()

    def stop(self) -> None:
        """Tear everything down (idempotent). Never raises: each part is stopped even if another failed."""
        if self._stopped or not self._started:
            return
        self._stopped = True
        parts: tuple[tuple[str, object, str], ...] = (
            ("autoscaler", self.pool_scaler, "stop"),  # first: its step in progress completes or is undone
            ("autoscaler", self.autoscaler, "request_stop"), ("producer", self.producer, "stop"),
            ("workers", self.fleet, "stop"), ("autoscaler", self.autoscaler, "stop"),
            ("Cloud Run stand-in", self.standin, "stop"), ("registry stand-in", self.registry, "stop"),
            ("redis", self.redis, "stop"), ("reaper", self.reaper, "close"))
        steps: list[tuple[str, Callable[[], None]]] = [(what, getattr(part, method)) for what, part, method in parts
                                                       if part is not None]
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # keep tearing down the rest
                log.warning("demo teardown: stopping the %s failed: %s", what, exc)
        if self._saved_env is not None:
            os.environ.clear()
            os.environ.update(self._saved_env)
        if self._own_root and not self.keep and self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
