"""Autoscale chaos trials (issue 36): ``celeryops autoscale`` sizing a Cloud Run worker pool of the stand-in, whose
instances are real fence-plugin workers and whose dropped counts take instances away at random (SIGTERM, SIGKILL
10 s later), through two bursts of tasks, with faults (``TrialPlan.draw_autoscale``):

1. the pool starts with one instance of its first revision and the autoscaler (``[autoscale]`` min 0 or 1, max 3,
   one task per instance, interval 0.5 s, idle_after 2 s); once it looked, a burst of tasks comes: it adds cohorts,
   and takes idle ones away once the burst is done; a second burst comes while it runs;
2. the interruption: SIGKILL or SIGINT right after one journal record of its steps (``celeryops_harness.killcli``).
   After a SIGINT it must exit 0 with the step completed or undone (no fence, no open run); after a SIGKILL,
   ``status`` names the open step, and the operator runs the drawn recovery (``abort``, ``resume``, or just the next
   ``autoscale``; half of the time from a teammate's machine, the operator's state dir lost). Either way the
   autoscaler is started again (a supervisor would), and goes on;
3. timed faults, a random delay after the autoscaler reports one of its steps: a worker SIGKILLed, the broker
   crashed and restarted, ``celeryops deploy`` started (it waits for the step, then deploys at the count in force);
4. once every task ran and the pool is back at its minimum (or a deadline passed), SIGINT: exit 0.

The verdict: the chaos trials' (0 lost, 0 duplicated, every live worker consuming, exit codes, no run left open),
plus no fence and no lease left up (stranded: the next run would wait for it), no instance taken away busy (the
trial's instance handles see every SIGTERM and SIGKILL), and no count of a revision lowered while any of its
instances ran or held a task of the trial, whichever instance the stand-in then picked (:class:`WatchedInstances`).
"""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from celeryops.demo.standins.cloudrun import CloudRunStandIn
from celeryops.demo.standins.cloudrun_instances import Instance, InstanceSet
from celeryops.fence.store import FenceStore
from celeryops.ops.fleetwide.lease import LeaseInfo, read_lease
from celeryops_harness.chaos_plan import RECORD_SIGNAL, Fault
from celeryops_harness.chaos_procs import CliRun, TrialFleet, TrialInstance
from celeryops_harness.chaos_trial import PROJECT, REGION, RELEASE, Trial
from celeryops_harness.chaos_verdict import Verdict
from celeryops_harness.workers import wait_for

if TYPE_CHECKING:
    from celeryops_harness.chaos import ChaosLab

#: The trials' [autoscale] table (min_instances is drawn; queues is the trial's queue).
SETTINGS = {"max_instances": 3, "interval": 0.5, "idle_after": 2, "drain_timeout": 30, "tasks_per_instance": 1}
#: Seconds a trial's autoscalers are given, from the first start, to run every task and scale back to the minimum.
TRIAL_LIMIT = 100.0
#: Seconds the autoscaler may wait for the lease of a run whose owner is gone before the trial calls it stranded.
STUCK_LIMIT = 20.0
#: Deploys and recovery commands: seconds each may take.
COMMAND_LIMIT = 240.0

OnDrop = Callable[[str, str, int, list[Instance]], None]


@dataclass
class WatchedInstances(InstanceSet):
    """The stand-in's instances, telling ``on_drop(resource, revision, keep, running)`` whenever a revision's count
    drops, before any of its instances is picked: what runs on each of them then is what the count drop risks."""

    on_drop: OnDrop | None = None

    def shrink(self, resource: str, wanted: Mapping[str, int]) -> list[Instance]:
        if self.on_drop is not None:
            for revision, running in self.running(resource).items():
                keep = max(0, wanted.get(revision, 0))
                if keep < len(running):
                    self.on_drop(resource, revision, keep, running)
        return super().shrink(resource, wanted)


def watch_drops(standin: CloudRunStandIn, on_drop: OnDrop) -> None:
    """From now on ``standin`` tells ``on_drop`` about every count drop. It replaces the stand-in's instance set: call
    it before any instance was started."""
    old = standin.instance_set
    standin.instance_set = WatchedInstances(old.launcher, old.grace, old.rng, on_drop=on_drop)


class AutoscaleTrial(Trial):
    """One seeded autoscale trial (see the module docstring)."""

    def __init__(self, lab: ChaosLab, plan: Any) -> None:
        super().__init__(lab, plan)
        self.pool = True
        self._scaler: CliRun | None = None
        self._deploys: list[threading.Thread] = []
        self._look: dict[str, Any] = {}  # the autoscaler's last look
        self._record: redis.Redis | None = None
        self._producers: list[threading.Timer] = []
        self._drops: list[str] = []  # count drops while an instance of the revision was busy
        self._stuck_since = 0.0  # since when the autoscaler waits for an orphaned lease
        self._stranded: list[str] = []  # a fence or lease left up (the verdict adds the workers not consuming)
        self._events = self.dir / "autoscale.jsonl"  # every autoscaler's events, kept with a failing trial's logs

    def write_config(self) -> None:
        super().write_config()
        table = {**SETTINGS, "min_instances": self.plan.min_instances}
        with (self.dir / "celeryops.toml").open("a") as out:
            out.write("\n[autoscale]\n" + "".join(f"{k} = {v}\n" for k, v in table.items())
                      + f'queues = ["{self.queue}"]\n')

    # -- events and faults ---------------------------------------------------------------------------------------

    def _on_event(self, event: dict[str, Any]) -> None:
        with contextlib.suppress(OSError), self._events.open("a") as out:
            out.write(json.dumps(event) + "\n")
        if event.get("event") == "autoscale_step":
            self._moment = str(event.get("step"))
            self._schedule(self._moment)
        elif event.get("event") == "autoscale":
            self._look = event

    def _fire(self, index: int, fault: Fault, *more: Any) -> None:
        if fault.kind != "deploy":
            super()._fire(index, fault, *more)
            return
        if index in self._fired:
            return
        self._fired.add(index)
        self.result.faults.append(f"{fault.describe()}(in {self._moment})")
        thread = threading.Thread(target=self._deploy_now, daemon=True, name="chaos-deploy")
        self._deploys.append(thread)
        thread.start()

    def _deploy_now(self) -> None:
        """``celeryops deploy``, started while the autoscaler runs: it waits for the step in progress, deploys at the
        count in force, and the autoscaler goes on from the new revision."""
        rc, events, err = self.cli("deploy", RELEASE, "--yes", "--accept-warnings", "--repo", str(self.lab.git.work),
                                   timeout=COMMAND_LIMIT)
        if rc != 0 and not self._broker_crashed():
            said = str(events[-1].get("message", "")) if events else ""
            self.result.anomalies.append(f"the deploy started mid-step exited {rc}: {(said or err).strip()[-300:]}")

    def _broker_crashed(self) -> bool:
        return any(f.startswith("redis_restart") for f in self.result.faults)

    def _dropped(self, resource: str, revision: str, keep: int, running: list[Instance]) -> None:
        """A count drop on the trial's pool: none of the revision's instances may run or hold a task then."""
        if resource.rsplit("/", 1)[-1] != self.service or self.fleet is None:
            return
        for instance in running:
            if isinstance(instance.handle, TrialInstance):
                ran, held = self.fleet.busy_on(instance.handle.worker)
                if ran or held:
                    self._drops.append(f"count of {revision} lowered from {len(running)} to {keep} while "
                                            f"{instance.handle.worker.nodename} ran {len(ran)} and held {len(held)} "
                                            "task(s)")

    # -- the autoscaler ------------------------------------------------------------------------------------------

    def _start(self, kill_after: str | None = None) -> CliRun:
        self._scaler = CliRun(["autoscale", "--json"], self.env(), self.dir, self._on_event, kill_after=kill_after)
        return self._scaler

    def _done(self, started: float) -> bool:
        """Every task ran (or died with a worker the trial killed) and the pool is back at its minimum; or the
        trial's time is up."""
        if time.monotonic() - started > TRIAL_LIMIT:
            return True
        if self._look.get("action") == "wait" and "orphaned" in str(self._look.get("reason")):
            self._stuck_since = self._stuck_since or time.monotonic()
            if time.monotonic() - self._stuck_since > STUCK_LIMIT:  # it waits for a dead run's lease: for good
                self._stranded.append(f"the autoscaler waited {STUCK_LIMIT:g} s for an orphaned lease: "
                                            f"{self._look.get('reason')}")
                return True
        else:
            self._stuck_since = 0.0
        if any(t.is_alive() for t in self._producers) or self.open_run() is not None:
            return False
        assert self.fleet is not None and self._record is not None
        killed = {w.nodename for w in self.fleet.killed}
        pipe = self._record.pipeline()
        for tid in self.ids:
            pipe.hmget(f"ct:run:{tid}", "finished", "worker")
        states = pipe.execute()
        # A killed worker's prefetched tasks wait out the visibility timeout in ``unacked``: held, not to wait for.
        stuck = Verdict(self.fleet, self.queue, self.ids, self.broker.url).unacked() if killed else set()
        if not all(done or worker in killed or tid in stuck for tid, (done, worker) in zip(self.ids, states,
                                                                                          strict=True)):
            return False
        return self._look.get("instances") == self.plan.min_instances and self._look.get("action") == "hold"

    def _until_done_or_exit(self, scaler: CliRun, started: float) -> None:
        wait_for(lambda: scaler.proc.poll() is not None or self._done(started), TRIAL_LIMIT + 60,
                 "the autoscaler to exit or the trial to end", step=0.3)

    def _stop(self, scaler: CliRun, what: str) -> None:
        """SIGINT: the step in progress completes or is undone, exit 0."""
        if scaler.proc.poll() is None:
            scaler.proc.send_signal(signal.SIGINT)
        rc = scaler.wait(120)
        self.result.commands.append(("autoscale", rc))
        if rc != 0:
            self.result.anomalies.append(f"{what}: the autoscaler exited {rc} after SIGINT: "
                                         f"{scaler.stderr.strip()[-300:]}")
        self._after_sigint(what)

    def _after_sigint(self, what: str) -> None:
        """Right after an autoscaler's exit on SIGINT: no fence up, no run open."""
        fence = self._fence()
        if fence:
            self._stranded.append(f"{what}: fence of run {fence} up after the autoscaler exited on SIGINT")
        left = self.open_run()
        if left is not None:
            self.result.anomalies.append(f"{what}: run {left.id} open in phase {left.phase} after the autoscaler "
                                         "exited on SIGINT")

    def _fence(self) -> str:
        """The run id of the fleet's fence when one is up, else ""."""
        client = redis.Redis.from_url(self.broker.url, socket_timeout=5, decode_responses=True)
        try:
            record = FenceStore(client, f"chaos-{self.tag}").read()
        except redis.RedisError as exc:
            return f"<unreadable: {exc}>"
        finally:
            client.close()
        return record.run_id if record is not None else ""

    def _lease(self) -> LeaseInfo | None:
        client = redis.Redis.from_url(self.broker.url, socket_timeout=5, decode_responses=True)
        try:
            return read_lease(client, f"chaos-{self.tag}")
        except redis.RedisError:
            return None
        finally:
            client.close()

    def _interrupted(self, fault: Fault, rc: int) -> None:
        """The autoscaler exited at the interruption's record: the exit code it owes, then the operator's part."""
        self.result.commands.append(("autoscale", rc))
        self.result.faults.append(fault.describe())
        if fault.sig == "SIGINT":
            if rc != 0:
                self.result.anomalies.append(f"the autoscaler exited {rc} on SIGINT at {fault.point}: "
                                             f"{self._scaler.stderr.strip()[-300:] if self._scaler else ''}")
            self._after_sigint(f"SIGINT at {fault.point}")
            return
        if rc != -signal.SIGKILL:
            self.result.anomalies.append(f"the autoscaler exited {rc}, expected -9 (SIGKILL at {fault.point})")
        if fault.lost:
            self.lose_machine()
        rc, _, err = self.cli("status")
        if rc not in (0, 1):
            self.result.anomalies.append(f"status exited {rc} after the autoscaler's SIGKILL: {err.strip()[-200:]}")
        if fault.then in ("abort", "resume") and self.open_run() is not None:
            wait_for(self._lease_gone_or_orphaned, 60, "the dead autoscaler's lease to expire", step=0.2)
            rc, _, err = self.cli(fault.then, timeout=COMMAND_LIMIT)
            if rc != 0:
                self.result.anomalies.append(f"{fault.then} of the killed step exited {rc}: {err.strip()[-300:]}")
            elif self._fence():
                self._stranded.append(f"{fault.then} exited 0 and left the fence up")

    # -- the whole trial ------------------------------------------------------------------------------------------

    def _run(self, record: redis.Redis) -> None:
        plan, lab = self.plan, self.lab
        self._record = record
        self.broker.start(timeout=30)
        self.fleet = TrialFleet(self.broker_url, lab.record.url, self.queue, self.dir, fleet=f"chaos-{self.tag}")
        self.fleet.ids = self.ids
        lab.route(self.service, self.fleet)
        lab.watch(self.service, self._dropped)
        lab.standin.add_worker_pool(PROJECT, REGION, self.service, f"{lab.registry.host}/proj/worker:old",
                                    instances=1)
        self.fleet.attach(lab.standin, self.service)
        self._first_revision = lab.standin.revisions(self.service)[0].name
        self.write_config()
        self._mark("setup")
        (interruption,) = [f for f in plan.faults if f.kind == RECORD_SIGNAL]
        prefix = "SIGINT@" if interruption.sig == "SIGINT" else ""
        first = self._start(kill_after=prefix + interruption.point)
        started = time.monotonic()
        wait_for(lambda: self._look or first.proc.poll() is not None, 60, "the autoscaler's first look", step=0.1)
        for seconds in plan.early:
            self.enqueue(seconds)
        self._producers = [threading.Timer(at, self.enqueue, (seconds,)) for at, seconds in plan.late]
        for p in self._producers:
            p.daemon = True
            p.start()
        self._until_done_or_exit(first, started)
        if first.proc.poll() is None:  # the record never came: the autoscaler ran the whole trial
            self.result.skipped.append(f"{interruption.describe()}(never came)")
        else:
            self._interrupted(interruption, first.wait(30))
            self._mark("interruption")
            scaler = self._start()
            self._until_done_or_exit(scaler, started)
            if scaler.proc.poll() is not None:
                self.result.commands.append(("autoscale", scaler.wait(30)))
                self.result.anomalies.append(f"the autoscaler exited {scaler.proc.returncode} by itself: "
                                             f"{scaler.stderr.strip()[-300:]}")
        if self._scaler is not None and self._scaler.proc.poll() is None:
            self._stop(self._scaler, "at the end")
        self._mark("autoscale")
        for t in self._deploys:
            t.join(COMMAND_LIMIT)
        for p in self._producers:
            p.join(30)
        for t in self._timers:
            t.join(30)
        for index, fault in enumerate(plan.faults):
            if fault.at and index not in self._fired:
                self.result.skipped.append(f"{fault.describe()}(never came)")
        lab.standin.wait_rollouts(60)
        self.follow_status()
        left = self.open_run()
        if left is not None:
            self.result.anomalies.append(f"run {left.id} left open in phase {left.phase} at the end")
        fence = self._fence()
        if fence:
            self._stranded.append(f"fence of run {fence} left up at the end")
        lease = self._lease()
        if lease is not None:  # nothing runs any more: a lease left behind keeps every later run waiting
            self._stranded.append(f"the fleet's lease left held by run {lease.run_id} at the end "
                                        f"({'orphaned' if lease.orphaned else 'live'})")
        counts = [len(found) for found in lab.standin.instances(self.service).values() if found]
        self.result.ending = f"{sum(counts)} instance(s) on {len(counts)} revision(s)"
        self.result.anomalies.extend(self.fleet.errors)
        self.result.busy.extend([*self.fleet.taken_busy, *self._drops])
        self.result.anomalies.extend(f"taken away busy: {b}" for b in self.fleet.taken_busy)
        self.result.anomalies.extend(f"count dropped busy: {d}" for d in self._drops)
        self.verdict(record)
        self.result.stranded.extend(self._stranded)
