"""The fence worker plugin: a consumer bootstep that keeps fenced queues unconsumed while a drain runs.

How it hooks into Celery (checked against celery/worker/consumer): the step ``requires`` the Tasks step, so its
``start`` runs after the task consumer is created but before the event loop calls ``consume()``, and again after
every broker reconnect. There it reads the fence and cancels the held queues (``c.cancel_task_queue``) before any
fetch. Then every ``interval`` the fence is read, the registry heartbeat written, and the consumer made to follow
the latest decision in its own thread: fence holds -> keep the held queues cancelled; fence gone/expired/lifted or
this worker exempt -> restore (``c.add_task_queue``) exactly the queues the plugin itself stopped, nothing else.
Where that runs depends on the pool (:mod:`celeryops.core.forking`):

- a pool that forks (prefork): everything on the consumer's timer (``c.timer.call_repeatedly``, the hub's timer), so
  that no thread of the plugin is alive when the pool forks a child; only while the consumer reconnects to the broker
  (its loop stopped, and no child forked until it runs again) does a thread keep the heartbeat, stopped before the
  loop resumes. A Redis that does not answer is tried again 2, 4, then every 8 intervals;
- a pool that runs tasks in the worker's process (solo, threads, green): a daemon thread reads the fence and
  heartbeats (a solo-pool worker runs its task inside the event loop and its timer stalls meanwhile), and the timer
  applies the decision.

Every Redis call is bounded for the event loop: a connection within 1 s, a reply within 0.5 s, no retry after a
timeout (:data:`celeryops.core.forking.LOOP_REPLY_TIMEOUT`).

Redis unreachable (safe behaviour): the plugin keeps the last decision it could read and logs an error (again every
30 s) until Redis answers. If it has never been able to read the fence (Redis down at worker start), it holds every
queue ("unknown" state) unless ``hold_if_unknown=False``: a worker that cannot tell whether a deploy is draining must
not start long tasks that a deploy would kill. Losing the fence Redis therefore never releases a held worker, and a
worker that started while Redis was down consumes as soon as it reads that there is no fence.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import redis
from celery import Celery, bootsteps
from celery.exceptions import ImproperlyConfigured
from celery.utils.log import get_logger
from kombu.entity import Queue
from redis.backoff import NoBackoff
from redis.retry import Retry

from celeryops.core.forking import LOOP_CONNECT_TIMEOUT, LOOP_REPLY_TIMEOUT, pool_forks
from celeryops.core.instance import connect_rename, instance_id
from celeryops.core.masking import mask_text, mask_url
from celeryops.core.namespace import fleet_name
from celeryops.fence import registry
from celeryops.fence.control import CONSUMER_ATTR, register_command
from celeryops.fence.record import FEATURES, UNKNOWN_HOLD, Hold, cloud_run_identity
from celeryops.fence.selfreport import STATS_KEY, SelfReport
from celeryops.fence.store import FenceStore

logger: logging.Logger = get_logger(__name__)

ENV_REDIS_URL = "CELERYOPS_FENCE_REDIS_URL"
ENV_VERSION = "CELERYOPS_VERSION"
ERROR_LOG_EVERY = 30.0
PRUNE_EVERY_BEATS = 100
# the longest a round of the thread takes to end once told to: a fence read and a heartbeat's three writes, each
# bounded (a connection, then a reply)
THREAD_JOIN = 4 * (LOOP_CONNECT_TIMEOUT + LOOP_REPLY_TIMEOUT) + 1.0
BACKOFF_MAX = 8  # on the event loop, a fence Redis that does not answer is tried again 2, 4, then 8 intervals later


@dataclass(frozen=True)
class FenceConfig:
    """``install()`` arguments, resolved against the environment when the worker starts."""

    redis_url: str | None = None
    interval: float = 2.0
    version: str | None = None
    fleet: str | None = None
    registry_ttl: float | None = None
    hold_if_unknown: bool = True
    redis_timeout: float = 2.0


def resolve_redis_url(app: Celery, explicit: str | None) -> str | None:
    """The fence Redis: ``explicit``, else $CELERYOPS_FENCE_REDIS_URL, else the broker URL when it is Redis."""
    if explicit:
        return explicit
    if os.environ.get(ENV_REDIS_URL):
        return os.environ[ENV_REDIS_URL]
    broker = app.conf.broker_url
    if isinstance(broker, list | tuple):
        broker = broker[0] if broker else None
    first = str(broker or "").split(";")[0].strip()
    if first.startswith(("redis://", "rediss://")):
        return first
    return None


class FenceGuard:
    """The plugin's state for one worker: the last decision read from the fence, the queues it stopped, and the
    thread that reads the fence and heartbeats the registry. Queue changes happen only in the consumer's thread."""

    def __init__(self, consumer: Any, config: FenceConfig, redis_url: str) -> None:
        self.c = consumer
        self.config = config
        self.interval = float(config.interval)
        self.hostname = str(consumer.hostname)
        self.version = config.version or os.environ.get(ENV_VERSION) or ""
        self.cloud_run = cloud_run_identity(os.environ)  # a pool's or a service's revision: exempt by it
        self.revision = self.cloud_run.revision
        self.instance = instance_id()  # told apart from instances that share its node name (Cloud Run: localhost)
        self.fleet = fleet_name(config.fleet)
        self.registry_ttl = config.registry_ttl or max(30.0, 5 * self.interval)
        self.redis_url = redis_url
        self.on_loop = pool_forks(getattr(consumer, "pool", None))  # no thread of ours where the pool forks
        self.client = redis.Redis.from_url(  # bounded: also read from the event loop
            redis_url, socket_connect_timeout=min(config.redis_timeout, LOOP_CONNECT_TIMEOUT),
            socket_timeout=min(config.redis_timeout, LOOP_REPLY_TIMEOUT),
            retry=Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,)))
        self.store = FenceStore(self.client, self.fleet)
        self._hold: Hold | None = None
        self._known = False  # the fence has been read at least once
        self._fence_run_id = ""
        self._readable = True
        self._last_error_log = 0.0
        self._stopped: dict[str, Queue] = {}
        self._free: dict[str, Queue] = {}  # what the worker consumed at the last check without a fence
        self._queues: tuple[str, ...] = ()
        self._held: tuple[str, ...] = ()
        self._beats = 0
        self._field = ""  # its registry field: the node name, or <node name>#<instance> when another holds it
        self._consumer_starts = 0
        self._tref: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._doctor: SelfReport | None = None  # what `celeryops doctor` reads from inside (made at first status)
        self._fails = 0  # fence reads that failed in a row (on the event loop)
        self._next_try = 0.0

    # --- consumer bootstep hooks (consumer thread) ---

    def on_consumer_start(self) -> None:
        if self.on_loop:
            self._stop_thread()  # the one that beat while the consumer reconnected: the loop runs again
        self._consumer_starts += 1
        self.refresh()
        if not self._known and self.config.hold_if_unknown:
            self._hold = UNKNOWN_HOLD
        if self._consumer_starts > 1:
            self._keep_after_reconnect()
        self.apply()
        self._tref = self.c.timer.call_repeatedly(self.interval, self._check if self.on_loop else self._tick)
        if not self.on_loop:
            self._start_thread()

    def on_consumer_stop(self, restarting: bool = False) -> None:
        """``restarting``: the consumer lost the broker and reconnects; its loop (and so the timer) stops meanwhile."""
        tref, self._tref = self._tref, None
        if tref is not None:
            tref.cancel()
        if restarting and self.on_loop:
            self._start_thread()  # no child is forked before the loop runs again, and the next start stops it

    def shutdown(self) -> None:
        self.on_consumer_stop()
        self._stop_thread()
        try:
            registry.remove(self.client, self.fleet, self._field or self.hostname)
        except redis.RedisError:
            pass
        self.client.close()

    def _keep_after_reconnect(self) -> None:
        """Celery rebuilds the task consumer after a broker reconnect from its *selected* queues, and a queue that was
        cancelled and then added back by remote control (``add_consumer``, e.g. a drain's restore) is not selected
        any more: the worker would silently stop consuming it. Put back what it consumed before the reconnect
        (unless a fence holds it)."""
        cset = self.c.task_consumer
        if cset is None:
            return
        consuming = {q.name for q in cset.queues}
        hold = self._hold
        for name, queue in sorted(self._free.items()):
            if name in consuming or name in self._stopped:
                continue
            if hold is not None and hold.selects({name: queue}):
                continue
            self.c.app.amqp.queues.select_add(queue)
            self.c.add_task_queue(name)
            logger.warning("celeryops fence: queue %s was dropped by the broker reconnect: consuming it again", name)

    def _start_thread(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="celeryops-fence", daemon=True)
            self._thread.start()

    def _stop_thread(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=THREAD_JOIN)

    def _check(self) -> None:
        """The timer's fence check where the pool forks, in the consumer's thread: read the fence and beat (a Redis
        that did not answer is tried again after 2, 4, then 8 intervals, so a hung one costs the loop little), then
        apply the decision."""
        try:
            if time.monotonic() >= self._next_try:
                self.refresh()
                if self._readable:
                    self._fails = 0
                    self.beat()
                else:
                    self._fails += 1
                    self._beats += 1  # a beat that could not be written, as the thread counts it
                    self._next_try = time.monotonic() + self.interval * (min(2 ** self._fails, BACKOFF_MAX) - 0.5)
        except Exception:  # never let the fence take the consumer down
            logger.exception("celeryops fence: the fence check failed on %s", self.hostname)
        self._tick()

    def _tick(self) -> None:
        if self.c.hub is not None:  # the hub's timer runs in the consumer thread
            self.apply()
        else:  # timer thread: hand the change to the consumer loop
            self.c.call_soon(self.apply)

    def apply(self) -> None:
        """Make the consumer follow the latest decision. Only the queues the plugin stopped are ever restored."""
        try:
            self._apply()
        except Exception:  # never let the fence take the consumer down
            logger.exception("celeryops fence: could not apply the fence decision on %s", self.hostname)

    def _apply(self) -> None:
        cset = self.c.task_consumer
        if cset is None:
            return
        hold = self._hold
        consuming = {q.name: q for q in cset.queues}
        if hold is None and self._known and set(self._free) - set(consuming):
            # A queue just stopped: the drain raises its fence before its cancel broadcast, so read it now (the
            # reader thread may not have seen it yet) to know whether the fence owns this stop.
            self.refresh()
            hold = self._hold
        elif hold is not None and hold is not UNKNOWN_HOLD and hold.selects(consuming):
            # A held queue is consumed again: an abort or a restore lifts the fence before it adds the queues back,
            # so the decision read up to one interval ago may be stale. Read the fence again before stopping it:
            # a restore that was just confirmed must not be undone for an interval.
            self.refresh()
            hold = self._hold
        if hold is None:
            self._free = dict(consuming)
            to_stop: set[str] = set()
            to_restore = set(self._stopped)
        else:
            to_stop = hold.selects(consuming)
            to_restore = {n for n in self._stopped if hold.queues is not None and n not in hold.queues}
            # The drain's cancel broadcast (sent right after it raised the fence) usually stops a held queue
            # before this check does: the fence owns that stop too, so the queue comes back when the fence goes
            # (lifted, or expired because the operator's run died).
            for name in sorted(hold.selects(self._free) - set(consuming) - set(self._stopped)):
                self._stopped[name] = self._free[name]
                logger.warning("celeryops fence: queue %s was stopped while the fence of run %s holds it: it will "
                               "be consumed again when the fence goes", name, hold.run_id or "?")
        for name in sorted(to_stop):
            self.c.cancel_task_queue(name)
            self._stopped[name] = consuming[name]
            why = f"fence of run {hold.run_id}" if hold is not None and hold.run_id else "unreadable fence"
            logger.warning("celeryops fence: %s holds queue %s: stopped consuming it", why, name)
        for name in sorted(to_restore):
            queue = self._stopped.pop(name)
            # add_task_queue() alone leaves the queue deselected, so a later reconnect would drop it again.
            self.c.app.amqp.queues.select_add(queue)
            self.c.add_task_queue(name)
            logger.warning("celeryops fence: fence released queue %s: consuming it again", name)
        now = {q.name for q in cset.queues}
        self._queues = tuple(sorted(now | set(self._stopped)))
        self._held = tuple(sorted(self._stopped))

    # --- fence reading and heartbeat (daemon thread, and once at consumer start) ---

    def refresh(self) -> None:
        """Read the fence and update the decision; on a Redis error keep the last decision and log loudly."""
        try:
            record = self.store.read()
        except redis.RedisError as exc:
            self._readable = False
            now = time.monotonic()
            if not self._last_error_log or now - self._last_error_log >= ERROR_LOG_EVERY:
                self._last_error_log = now
                kept = ("holding every queue until it can" if not self._known and self.config.hold_if_unknown
                        else "keeping the last decision (" + ("held" if self._hold else "consuming") + ")")
                logger.error("celeryops fence: cannot read the drain fence from %s (%s); %s; check that Redis is "
                             "reachable from this worker", mask_url(self.redis_url), mask_text(str(exc)), kept)
            return
        if not self._readable:
            logger.warning("celeryops fence: the drain fence is readable again")
        self._readable = True
        self._last_error_log = 0.0
        self._known = True
        self._fence_run_id = record.run_id if record else ""
        self._hold = record.hold_for(self.revision, self.version) if record else None

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh()
            if self._stop.is_set():
                break
            self.beat()
            if self._stop.wait(self.interval):
                break

    def state(self) -> registry.PluginState:
        if self._hold is UNKNOWN_HOLD:
            return "unknown"
        return "held" if self._held else "consuming"

    def status(self) -> dict[str, Any]:
        """The control command's reply and the registry entry."""
        return {
            "plugin": True, "fleet": self.fleet, "version": self.version, "revision": self.revision,
            "cloudrun_kind": self.cloud_run.kind, "cloudrun_name": self.cloud_run.name, "state": self.state(),
            "queues": list(self._queues), "held_queues": list(self._held), "fence_run_id": self._fence_run_id,
            "fence_readable": self._readable, "interval": self.interval, "beats": self._beats,
            "consumer_starts": self._consumer_starts, "features": list(FEATURES),
            "instance_id": self.instance.value, "instance_source": self.instance.source,
            "doctor": self.doctor_report(),
        }

    def doctor_report(self) -> dict[str, Any]:
        """What `celeryops doctor` reads from inside this worker (:mod:`celeryops.fence.selfreport`)."""
        try:
            if self._doctor is None:
                self._doctor = SelfReport(self.c)
            return self._doctor.snapshot()
        except Exception:  # a report never takes the plugin down
            return {}

    def beat(self) -> None:
        self._beats += 1
        info = {**self.status(), "pid": os.getpid(), "hostname": self.hostname}
        try:
            field = registry.claim_field(self.client, self.fleet, self.hostname, self.instance.value)
            if field != self._field:
                if field != self.hostname:
                    logger.error("celeryops fence: another live instance answers as %s too: this one is listed as "
                                 "%s; celeryops refuses to stop workers that share a node name: start each worker "
                                 "with a unique -n", self.hostname, field)
                elif self._field:  # the other instance left: back under its node name
                    registry.remove(self.client, self.fleet, self._field)
                self._field = field
            registry.write_heartbeat(self.client, self.fleet, self._field, info, self.registry_ttl)
            if self._beats % PRUNE_EVERY_BEATS == 1:
                registry.prune(self.client, self.fleet, grace=max(3600.0, 10 * self.registry_ttl))
        except redis.RedisError:
            pass  # refresh() already reports an unreachable Redis


class FenceStep(bootsteps.StartStopStep):  # type: ignore[misc]
    """Consumer bootstep; ``install()`` makes a subclass carrying the configuration."""

    requires = ("celery.worker.consumer.tasks:Tasks",)
    config: ClassVar[FenceConfig] = FenceConfig()

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        url = resolve_redis_url(c.app, self.config.redis_url)
        if not url:
            raise ImproperlyConfigured(
                "celeryops fence: no Redis to read the drain fence from; pass install(app, redis_url=...) or set "
                f"${ENV_REDIS_URL} (the broker is not Redis)"
            )
        self.guard = FenceGuard(c, self.config, url)
        setattr(c, CONSUMER_ATTR, self.guard)

    def start(self, c: Any) -> None:
        self.guard.on_consumer_start()

    def info(self, c: Any) -> dict[str, Any]:
        """Added to the worker's ``inspect stats`` reply: what `celeryops doctor` reads from inside this worker."""
        return {STATS_KEY: self.guard.doctor_report()}

    def stop(self, c: Any) -> None:
        # still RUN: the consumer restarts after losing the broker (a shutdown has set CLOSE before stopping steps)
        self.guard.on_consumer_stop(restarting=getattr(c.blueprint, "state", None) == bootsteps.RUN)

    def shutdown(self, c: Any) -> None:
        self.guard.shutdown()


def install(
    app: Celery,
    *,
    redis_url: str | None = None,
    interval: float = 2.0,
    version: str | None = None,
    fleet: str | None = None,
    registry_ttl: float | None = None,
    hold_if_unknown: bool = True,
) -> type[FenceStep]:
    """Install the drain fence plugin into ``app``'s workers (call it where the app is defined).

    ``redis_url``: where the fence lives (default $CELERYOPS_FENCE_REDIS_URL, else the broker when it is Redis);
    ``interval``: seconds between fence checks and registry heartbeats; ``version``: this build's version for
    exemptions (default $CELERYOPS_VERSION; the Cloud Run revision is always used too: a worker pool's
    $CLOUD_RUN_WORKER_POOL_REVISION, a service's $K_REVISION); ``fleet``: default
    $CELERYOPS_FLEET; ``registry_ttl``: how long a silent worker stays listed (default max(30 s, 5 intervals)).
    On Cloud Run, a worker whose node name has the default hostname (``celery@localhost`` on every instance) is
    renamed ``<name>@<revision>.<8 hex of its instance id>`` when it starts (logged once); a unique ``-n`` is kept.
    """
    if interval <= 0:
        raise ValueError(f"fence interval must be positive, got {interval}")
    if any(isinstance(s, type) and issubclass(s, FenceStep) for s in app.steps["consumer"]):
        raise RuntimeError("the celeryops fence plugin is already installed in this Celery app")
    register_command()
    connect_rename()  # on Cloud Run, celery@localhost becomes celery@<revision>.<instance> at worker start
    config = FenceConfig(redis_url=redis_url, interval=interval, version=version, fleet=fleet,
                         registry_ttl=registry_ttl, hold_if_unknown=hold_if_unknown)
    step: type[FenceStep] = type("InstalledFenceStep", (FenceStep,), {"config": config, "__module__": __name__})
    app.steps["consumer"].add(step)
    return step
