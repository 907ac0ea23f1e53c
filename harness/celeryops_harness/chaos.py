"""Randomized chaos trials of ``celeryops deploy`` against real workers (issue 9): the reusable trial runner.

One :class:`ChaosLab` holds what a series of trials shares (a record Redis, a git remote, the registry stand-in, the
Cloud Run stand-in); :meth:`ChaosLab.run` plays one trial, fully determined by its seed (:meth:`TrialPlan.draw`):

1. a private broker ``redis-server`` (with an append-only file, ``appendfsync always``: a real broker keeps its
   queues across a restart, so the "Redis restarts" fault is a crash of a *persistent* broker, not a wipe);
2. two real workers of the old revision (threads pool, ``acks_late=False``, prefetch 1) and recorded tasks with
   known ids, short and medium; more tasks are enqueued while the deploy runs (producers do not stop for a deploy);
3. ``celeryops deploy RELEASE --yes --accept-warnings --json`` as a subprocess, through the Cloud Run stand-in whose
   instances are the trial's workers: it starts the new revision's first, then takes the old ones away (SIGTERM =
   warm shutdown, SIGKILL 10 s later, as Cloud Run does);
4. faults at random moments, tied to what the deploy reports (preflight, first poll, drained, deploy stage) plus a
   random delay: a worker scales out; the deploy gets SIGKILL right after a random journal record, or SIGINT; the
   broker crashes and comes back; an old worker is SIGTERMed only after the new revision is up; the rollout fails;
5. the operator's recovery, as a person would do it: when a run is left open (``celeryops status``, read here
   in-process from the journal): wait for the dead owner's lease to expire, ``resume`` (after a SIGKILL before the
   drain finished, half of the time), else ``abort``; when abort answers "leave"/"ask" and the new revision serves,
   ``resume`` as advised, else ``abort --restore``;
6. the fleet is left to finish, then the verdict: every task ran exactly once or is still in the broker's queue
   (``lost`` = ran zero times and is nowhere; ``duplicated`` = ran twice), and every live worker consumes its queue
   (``stranded`` = a live worker that does not).

Used by ``tests/test_chaos.py`` (10 fixed seeds) and ``tools/chaos.py`` (``make chaos``: N trials and the table).

The parts: ``chaos_plan`` (the faults and tasks drawn from a seed), ``chaos_procs`` (the CLI as a subprocess, the
trial's workers), ``chaos_trial`` (steps 1 to 5), ``chaos_verdict`` (step 6, the result and the table). This
module holds the lab and re-exports the names of the parts.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from celeryops.demo.standins.cloudrun import CloudRunStandIn, InstanceLauncher, InstanceSpec
from celeryops.demo.standins.cloudrun_instances import Instance, InstanceHandle
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops_harness.chaos_autoscale import AutoscaleTrial, OnDrop, watch_drops
from celeryops_harness.chaos_plan import (
    AUTOSCALE_MOMENTS,
    AUTOSCALE_RECORDS,
    AUTOSCALE_SIGNALS,
    CANARY_MOMENTS,
    CANARY_RELEASES,
    CANARY_SIGNALS,
    CLI_SIGNAL,
    FAULT_KINDS,
    KILL_POINTS,
    MOMENTS,
    OVERLAP_FAULT_KINDS,
    OVERLAP_KILL_POINTS,
    OVERLAP_MOMENTS,
    RECORD_SIGNAL,
    STRATEGIES,
    WORKER_KILL,
    WORKER_KILL_MOMENTS,
    Fault,
    TrialPlan,
    machine_lost,
)
from celeryops_harness.chaos_procs import CLI, FENCED_APP, FLEET_KINDS, PLAIN_APP, CliRun, TrialFleet
from celeryops_harness.chaos_trial import PROJECT, REGION, RELEASE, RESUMABLE, Trial
from celeryops_harness.chaos_verdict import TrialResult, Verdict, summary

__all__ = [
    "AUTOSCALE_MOMENTS", "AUTOSCALE_RECORDS", "AUTOSCALE_SIGNALS", "BROKERS", "CANARY_MOMENTS", "CANARY_RELEASES",
    "CANARY_SIGNALS", "CLI", "CLI_SIGNAL", "FAULT_KINDS", "FENCED_APP", "FLEET_KINDS", "KILL_POINTS", "MOMENTS",
    "OVERLAP_FAULT_KINDS", "OVERLAP_KILL_POINTS", "OVERLAP_MOMENTS", "PLAIN_APP", "PROJECT", "RECORD_SIGNAL", "REGION",
    "RELEASE", "RESUMABLE", "STRATEGIES", "WORKER_KILL", "WORKER_KILL_MOMENTS", "AutoscaleTrial", "ChaosLab", "CliRun",
    "Fault", "Trial", "TrialFleet", "TrialPlan", "TrialResult", "Verdict", "machine_lost", "summary",
]

BROKERS = ("redis", "amqp")  # amqp: RabbitMQ (a vhost per trial); the trial's redis-server holds lease and fence


class ChaosLab:
    """What every trial shares. ``with ChaosLab(root) as lab: lab.run(seed)``. ``strategy="overlap"`` (or
    ``"canary"``): each trial's resource is a worker pool deployed with ``--strategy overlap`` (``canary``; the fleet
    runs the fence plugin, on Redis); ``"autoscale"``: a worker pool sized by ``celeryops autoscale``
    (``chaos_autoscale``)."""

    def __init__(self, root: Path, *, keep_logs: bool = False, fleet: str = "fenced", broker: str = "redis",
                 strategy: str = "drain") -> None:
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, not {strategy!r}")
        if strategy in ("overlap", "canary", "autoscale") and (fleet != "fenced" or broker != "redis"):
            raise ValueError(f"{strategy} trials run fence-plugin workers on a Redis broker (the {strategy} requires "
                             "the plugin on every worker)")
        self.strategy = strategy
        if fleet not in FLEET_KINDS:
            raise ValueError(f"fleet must be one of {', '.join(FLEET_KINDS)}, not {fleet!r}")
        if broker not in BROKERS:
            raise ValueError(f"broker must be one of {', '.join(BROKERS)}, not {broker!r}")
        self.broker = broker
        self.root = Path(root)
        self.keep_logs = keep_logs
        self.fleet = fleet
        self.record = RedisServer()
        self.registry = RegistryStandIn()
        self.standin = CloudRunStandIn(rollout_seconds=0.3, launcher=self._launch)
        self.git = GitFixture(self.root / "git", branch=RELEASE)
        self.endpoint = ""
        self._fleets: dict[str, InstanceLauncher] = {}
        self._watchers: dict[str, OnDrop] = {}
        if strategy == "autoscale":  # every count drop is checked against what the instances run then
            watch_drops(self.standin, self._dropping)
        self.results: list[TrialResult] = []

    def __enter__(self) -> ChaosLab:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> ChaosLab:
        self.root.mkdir(parents=True, exist_ok=True)
        self.record.start()
        self.git.create(commits=2, age=timedelta(days=1))
        self.registry.start()
        self.registry.seed("proj/worker", self.git.tip(self.git.remote))
        self.endpoint = self.standin.start()
        return self

    def close(self) -> None:
        self.standin.stop()
        self.registry.stop()
        self.record.close()

    def _launch(self, spec: InstanceSpec) -> InstanceHandle | None:
        """An instance of a trial's service is one of that trial's workers (none once the trial is over)."""
        fleet = self._fleets.get(spec.name)
        return fleet(spec) if fleet is not None else None

    def run(self, seed: int) -> TrialResult:
        kind = AutoscaleTrial if self.strategy == "autoscale" else Trial
        result = kind(self, TrialPlan.draw(seed, self.strategy)).run()
        self.results.append(result)
        return result

    def route(self, service: str, fleet: InstanceLauncher) -> None:
        """The instances of the stand-in's ``service`` are started by ``fleet`` (a trial's)."""
        self._fleets[service] = fleet

    def unroute(self, service: str) -> None:
        self._fleets.pop(service, None)
        self._watchers.pop(service, None)

    def watch(self, service: str, on_drop: OnDrop) -> None:
        """``on_drop`` hears of every count drop of ``service`` (autoscale trials)."""
        self._watchers[service] = on_drop

    def _dropping(self, resource: str, revision: str, keep: int, running: list[Instance]) -> None:
        watcher = self._watchers.get(resource.rsplit("/", 1)[-1])
        if watcher is not None:
            watcher(resource, revision, keep, running)
