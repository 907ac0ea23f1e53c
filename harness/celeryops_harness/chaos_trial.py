"""One seeded chaos trial (``Trial``): the broker, the fleet, the deploy with its faults, the operator's recovery.

The steps are in ``chaos.py``. Here: the trial's broker (a private, persistent redis-server; or a RabbitMQ vhost,
the redis-server then keeping lease and fence), its config, the producers; the faults, fired when the deploy
reports their moment (its ``--json`` events) or right after a journal record (a kill, through
``celeryops_harness.killcli``); the operator's recovery as a person would run it (``status`` read in-process,
``resume`` / ``abort`` / ``abort --restore`` as the advice says); the exit code checks; then ``Verdict``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import redis

from celeryops.demo.standins.cloudrun import standin_config
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.ops.fleetwide.lease import read_lease
from celeryops.ops.journal import FleetStore, Journal, Run, journal_path, merge_open
from celeryops.ops.run.recovery import plan as plan_recovery
from celeryops_harness.chaos_amqp import create_vhost, delete_vhost
from celeryops_harness.chaos_plan import WORKER_KILL, Fault, TrialPlan
from celeryops_harness.chaos_procs import CliRun, TrialFleet, aof_redis_server
from celeryops_harness.chaos_verdict import TrialResult, Verdict
from celeryops_harness.workers import wait_for

if TYPE_CHECKING:
    from celeryops_harness.chaos import ChaosLab

RELEASE = "release-chaos"
PROJECT, REGION = "proj", "europe-west1"
#: Phases a run can be resumed from (after a kill before the drain finished, the operator resumes half of the time).
RESUMABLE = ("preflight", "stopping", "draining")


class Trial:
    """One seeded trial (see the module docstring for the steps)."""

    def __init__(self, lab: ChaosLab, plan: TrialPlan) -> None:
        self.lab, self.plan = lab, plan
        self.tag = f"s{plan.seed}-{uuid.uuid4().hex[:6]}"
        self.dir = lab.root / self.tag
        self.dir.mkdir(parents=True)
        self.service = f"worker-{self.tag}"
        self.queue = f"chaos-{self.tag}"
        self.broker = RedisServer(binary=aof_redis_server(self.dir))
        self.overlap = plan.strategy == "overlap"  # a worker pool deployed with --strategy overlap
        self.result = TrialResult(seed=plan.seed, faults=[], skipped=[], log_dir=str(self.dir), fleet=lab.fleet,
                                  broker=lab.broker, strategy=plan.strategy)
        self.amqp = ""  # the trial's RabbitMQ vhost URL (lab.broker == "amqp")
        self.ids: list[str] = []
        self.state = self.dir / "state"  # the operator's state dir (a teammate's after a lost machine)
        self._broker_lock = threading.Lock()  # producers wait while the broker is down (they retry later)
        self._fired: set[int] = set()
        self._timers: list[threading.Timer] = []
        self._deploy: CliRun | None = None
        self._last = 0.0
        self._first_revision = ""
        self._moment = "start"  # the last moment the deploy reported (where a SIGINT lands)
        late = plan.has("late_sigterm")
        self.fleet: TrialFleet | None = None
        self._late = late.delay if late is not None else None

    # -- setup --------------------------------------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CELERYOPS_") and k != "CELERY_BROKER_URL"}
        env.update({"CELERYOPS_STATE_DIR": str(self.state), "CELERYOPS_FLEET": f"chaos-{self.tag}",
                    "CELERYOPS_LEASE_TTL": "2", "CELERYOPS_FENCE_TTL": "6", "PYTHONUNBUFFERED": "1"}, **extra)
        if self.amqp:
            env["CELERYOPS_REDIS_URL"] = self.broker.url
        return env

    def write_config(self) -> None:
        lab = self.lab
        (self.dir / "celeryops.toml").write_text(standin_config(
            broker=self.broker_url, endpoint=lab.endpoint, image=f"{lab.registry.host}/proj/worker:{{sha}}",
            interval=0.3, project=PROJECT, region=REGION, resource=self.service,
            kind="cloudrun-worker-pool" if self.overlap else "cloudrun-service"))

    def enqueue(self, duration: float) -> None:
        from celeryops_harness.taskapp import sleep

        tid = str(uuid.uuid4())
        with self._broker_lock:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with sleep.app.connection_for_write(self.broker_url) as conn:
                        sleep.apply_async(args=(duration, tid[:8]), task_id=tid, queue=self.queue, connection=conn,
                                          retry=False)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        self.result.anomalies.append("a producer could not enqueue for 30 s")
                        return
                    time.sleep(0.2)
            self.ids.append(tid)

    # -- faults -------------------------------------------------------------------------------------------------

    def _fire(self, index: int, fault: Fault) -> None:
        if index in self._fired:
            return
        self._fired.add(index)
        assert self.fleet is not None
        if fault.kind == "scale_out":
            self.fleet.scale_out()
        elif fault.kind == "sigint":
            deploy = self._deploy
            if deploy is None or deploy.proc.poll() is not None:
                self.result.skipped.append(fault.describe())
                return
            deploy.proc.send_signal(signal.SIGINT)
            self.result.faults.append(f"{fault.describe()}(in {self._moment})")
            return
        elif fault.kind == WORKER_KILL:
            if not self.fleet.kill_one():
                self.result.skipped.append(fault.describe())
                return
        elif fault.kind == "redis_restart":
            with self._broker_lock:
                self.broker.stop()  # SIGKILL: a crash; the AOF (fsync always) keeps every acknowledged write
                time.sleep(fault.downtime)  # the broker is down for a while (a fault's duration, not a wait)
                self.broker.start(timeout=30)
        self.result.faults.append(fault.describe())

    def _schedule(self, moment: str) -> None:
        for index, fault in enumerate(self.plan.faults):
            if fault.at == moment and index not in self._fired:
                timer = threading.Timer(fault.delay, self._fire, (index, fault))
                timer.daemon = True
                self._timers.append(timer)
                timer.start()

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "overlap" and event.get("step") in ("scaling_up", "consuming", "cutting_over"):
            self._moment = str(event["step"])
            self._schedule(self._moment)
            return
        if kind == "stage":
            self._moment = str(event.get("stage"))
        elif kind in ("poll", "drained"):
            self._moment = "draining" if kind == "poll" else "drained"
        if kind == "stage" and event.get("stage") == "preflight":
            self._schedule("preflight")
        elif kind == "poll":
            self._schedule("draining")
        elif kind == "drained":
            self._schedule("drained")
        elif kind == "stage" and event.get("stage") == "deploy":
            self._schedule("deploying")

    # -- the operator -------------------------------------------------------------------------------------------

    def cli(self, *args: str, timeout: float = 120) -> tuple[int, list[dict[str, Any]], str]:
        started = time.monotonic()
        run = CliRun([*args, "--json"], self.env(), self.dir)
        rc = run.wait(timeout)
        self.result.timings[f"{len(self.result.timings)}:{' '.join(args)}"] = round(time.monotonic() - started, 2)
        self.result.commands.append((args[0] + ("+restore" if "--restore" in args else ""), rc))
        return rc, run.events, run.stderr

    def open_run(self) -> Run | None:
        """What ``celeryops status`` shows as the current run, read in-process (a CLI call costs seconds here): the
        local journal's open runs and the ones the fleet's Redis holds (the only ones after a lost machine)."""
        local: list[Run] = []
        if journal_path(self.state).exists():
            with Journal(state_dir=self.state, read_only=True) as journal:
                local = journal.unfinished_runs(f"chaos-{self.tag}")
        client = redis.Redis.from_url(self.broker.url, socket_timeout=5, decode_responses=True)
        try:
            runs, _ended = merge_open(local, FleetStore(client, f"chaos-{self.tag}"))
        except redis.RedisError:
            runs = local
        finally:
            client.close()
        return runs[-1] if runs else None

    def lose_machine(self) -> None:
        """The operator's machine is gone with its state dir: recovery runs from a teammate's fresh state dir."""
        shutil.rmtree(self.state, ignore_errors=True)
        self.state = self.dir / "state-teammate"

    def recover(self, first: str) -> None:
        """Until no run is left open: wait for a dead owner's lease, then resume (once) or abort."""
        resumed = first != "resume"
        for _ in range(4):
            run = self.open_run()
            if run is None:
                return
            wait_for(self._lease_gone_or_orphaned, 60, "the dead deploy's lease to expire", step=0.2)
            if not resumed and (run.phase in RESUMABLE or self.overlap):  # an overlap run resumes from any step
                resumed = True
                rc, _, err = self.cli("resume")
                # A deploy run resumes through its deploy: a pending failed rollout then exits 6, as a deploy does.
                if rc not in ({0, 6} if self.plan.has("fail_rollout") else {0}):
                    self.result.anomalies.append(f"resume exited {rc}: {err.strip()[-200:]}")
                continue
            rc, events, err = self.cli("abort")
            action = next((e.get("action") for e in events if e.get("event") == "abort"), None)
            if action == "leave" or (action == "ask" and self.new_revision_serves()):
                # The advice: "run `celeryops resume` once the new revision serves". Follow it.
                rc, _, err = self.cli("resume")
                if rc != 0:
                    self.result.anomalies.append(f"recovery advised `celeryops resume` (the new revision serves) "
                                                 f"but resume exited {rc}: {err.strip()[-200:]}")
                    if action == "leave":
                        break  # nothing the operator can run closes it: reported below
                else:
                    action = "resumed"
            if action == "ask":
                rc, events, err = self.cli("abort", "--restore")
            if rc != 0:
                self.result.anomalies.append(f"abort exited {rc}: {err.strip()[-200:]}")
        left = self.open_run()
        if left is not None:
            self.result.anomalies.append(f"run {left.id} left open in phase {left.phase} after the recovery")

    def follow_status(self) -> None:
        """The operator's last look, once every live worker answers again (after a broker restart they reconnect):
        `celeryops status`; when it names workers a broker reconnect stranded after a restore (plain workers: Celery
        forgets restored queues at a reconnect) or a restore it could not confirm, its remedy, `celeryops abort`
        (the restore again)."""
        assert self.fleet is not None
        fleet = self.fleet

        def all_answer() -> bool:
            names = [w.nodename for w in fleet.alive() if w not in fleet.leaving()]
            if not names:
                return True
            try:
                replies = fleet.app.control.ping(destination=names, timeout=1.0, limit=len(names)) or []
            except Exception:
                return False
            return {n for r in replies for n in r} >= set(names)

        with contextlib.suppress(TimeoutError):
            wait_for(all_answer, 60, "every live worker to answer again", step=0.5)
        rc, events, err = self.cli("status")
        seen = events[-1] if events else {}
        if rc != 0:
            self.result.anomalies.append(f"status exited {rc}: {err.strip()[-200:]}")
        elif seen.get("stranded") or seen.get("unconfirmed"):  # status says: run `celeryops abort`
            rc, _, err = self.cli("abort")
            if rc != 0:
                named = {"stranded": seen.get("stranded"), "unconfirmed": seen.get("unconfirmed")}
                self.result.anomalies.append(f"status named stranded or unconfirmed consumers ({named}), but abort "
                                             f"exited {rc}: {err.strip()[-200:]}")

    def new_revision_serves(self) -> bool:
        latest = self.lab.standin.resource(self.service).latest_ready_revision
        return bool(latest) and latest != self._first_revision

    def _lease_gone_or_orphaned(self) -> bool:
        client = redis.Redis.from_url(self.broker.url, socket_timeout=3, decode_responses=True)
        try:
            lease = read_lease(client, f"chaos-{self.tag}")
        except redis.RedisError:
            return False
        finally:
            client.close()
        return lease is None or lease.orphaned

    @property
    def broker_url(self) -> str:
        return self.amqp or self.broker.url

    # -- the verdict --------------------------------------------------------------------------------------------

    def verdict(self, record: redis.Redis) -> None:
        assert self.fleet is not None
        Verdict(self.fleet, self.queue, self.ids, self.broker.url, self.amqp).judge(record, self.result)

    # -- the whole trial ----------------------------------------------------------------------------------------

    def _mark(self, step: str) -> None:
        now = time.monotonic()
        self.result.timings[step] = round(now - self._last, 2)
        self._last = now

    def run(self) -> TrialResult:
        t0 = self._last = time.monotonic()
        record = redis.Redis.from_url(self.lab.record.url, decode_responses=True)
        try:
            self._run(record)
            self._mark("verdict")
        except Exception as exc:
            self.result.anomalies.append(f"trial error: {type(exc).__name__}: {exc}")
            self.result.stranded = self.result.stranded or ["<trial error>"]
        finally:
            for t in self._timers:
                t.cancel()
            if self.fleet is not None:
                self.fleet.stop()
            self.broker.close()
            if self.amqp:
                delete_vhost(self.amqp)
            record.close()
            self.lab.unroute(self.service)
            self._mark("teardown")
            self.result.elapsed = time.monotonic() - t0
            if self.result.ok and not self.result.anomalies and not self.lab.keep_logs:
                shutil.rmtree(self.dir, ignore_errors=True)
        return self.result

    def _run(self, record: redis.Redis) -> None:
        plan, lab = self.plan, self.lab
        self.broker.start(timeout=30)
        if lab.broker == "amqp":
            self.amqp = create_vhost(self.tag)
        self.fleet = TrialFleet(self.broker_url, lab.record.url, self.queue, self.dir, kind=lab.fleet,
                                fleet=f"chaos-{self.tag}", coord=self.broker.url if self.amqp else "")
        self.fleet.ids = self.ids  # what it checks for tasks still running on an instance taken away
        lab.route(self.service, self.fleet)  # the resource's two instances: real workers of its first revision
        add = lab.standin.add_worker_pool if self.overlap else lab.standin.add_service
        add(PROJECT, REGION, self.service, f"{lab.registry.host}/proj/worker:old", instances=2)
        self.fleet.attach(lab.standin, self.service)
        self._first_revision = lab.standin.revisions(self.service)[0].name
        if self._late is not None:  # the old instances are taken away a while after the new revision is up
            lab.standin.delay_retirement(self.service, self._late)
        if plan.has("fail_rollout"):
            lab.standin.fail_next_rollout(self.service, "container failed to start: chaos")
            self.result.faults.append("fail_rollout")
        self.write_config()
        for seconds in plan.early:
            self.enqueue(seconds)
        self._mark("setup")

        before = next((f for f in plan.faults if f.kind == WORKER_KILL and f.at == "before"), None)
        if before is not None:  # killed before the deploy: OOM, or a scale-in SIGKILL; its binding stays
            with contextlib.suppress(TimeoutError):
                wait_for(lambda: any(record.exists(f"ct:run:{t}") for t in self.ids), 10, "a task to start",
                         step=0.1)
            self._fire(plan.faults.index(before), before)
        kill = plan.has("kill")
        producers = [threading.Timer(at, self.enqueue, (seconds,)) for at, seconds in plan.late]
        for p in producers:
            p.daemon = True
            p.start()
        strategy = ["--strategy", "overlap"] if self.overlap else []
        self._deploy = CliRun(["deploy", RELEASE, *strategy, "--yes", "--accept-warnings", "--json", "--repo",
                               str(lab.git.work)], self.env(), self.dir, self._on_event,
                               kill_after=kill.point if kill is not None else None)
        rc = self._deploy.wait(180)
        self.result.commands.append(("deploy", rc))
        (self.dir / "deploy.stderr").write_text(self._deploy.stderr)  # kept with the logs of a failing trial
        self._mark("deploy")
        # Timed faults whose moment never came still hit the fleet (during the recovery), except a SIGINT.
        for index, fault in enumerate(plan.faults):
            if fault.at and index not in self._fired and fault.kind != "sigint":
                self._fire(index, fault)
        for t in self._timers:
            t.join(30)
        for p in producers:
            p.join(30)
        if kill is not None and rc == -signal.SIGKILL:
            self.result.faults.append(kill.describe())
            if kill.lost:
                self.lose_machine()
        elif kill is not None:
            self.result.skipped.append(kill.describe())
        for fault in plan.faults:
            if fault.kind == "sigint" and fault.describe() not in self.result.faults:
                self.result.skipped.append(fault.describe())
        self._check_exit(rc)
        self._check_interrupted(rc)
        if rc != 0:
            self.recover(kill.then if kill is not None and rc == -signal.SIGKILL else "abort")
        self._mark("recovery")
        lab.standin.wait_rollouts(60)  # old instances taken away (a late SIGTERM too)
        self.follow_status()
        if self._late is not None and any(u[0].endswith(self.service) for u in lab.standin.updates):
            self.result.faults.append(f"late_sigterm+{self._late:.1f}s")
        self.result.anomalies.extend(self.fleet.errors)
        self.result.busy = list(self.fleet.taken_busy)
        if self.overlap:  # the overlap's promise: no instance is taken away while it runs a task
            self.result.anomalies.extend(f"taken away busy: {b}" for b in self.result.busy)
        self.verdict(record)

    def _check_interrupted(self, rc: int) -> None:
        """A deploy stopped by SIGINT applies the recovery rules itself (its last words say so): a run it leaves
        open with consumers that recovery would restore is a broken promise (workers stay stopped)."""
        if rc != 130:
            return
        run = self.open_run()
        if run is not None and run.stopped_consumers() and plan_recovery(run, None).action == "restore":
            self.result.anomalies.append(f"SIGINT in phase {run.phase}: the deploy exited 130 saying the recovery "
                                         "rules were applied, but it left its consumers stopped")

    def _check_exit(self, rc: int) -> None:
        """Exit codes the deploy owes its caller for the faults that hit it (a broker crash may change them)."""
        fired = " ".join(self.result.faults)
        if "redis_restart" in fired:
            return
        # the deploy's own SIGKILL (not worker_kill), with or without its machine
        if any(f.startswith(("kill@", "lost_machine@")) for f in self.result.faults):
            expected = {-signal.SIGKILL}
        elif "sigint" in fired:
            expected = {130, 0, 6}  # the signal may land after the flow finished
        elif "fail_rollout" in fired:
            expected = {6}
        else:
            expected = {0}
        if rc not in expected:
            tail = self._deploy.stderr.strip()[-300:] if self._deploy is not None else ""
            self.result.anomalies.append(f"deploy exited {rc}, expected {sorted(expected)}: {tail}")
