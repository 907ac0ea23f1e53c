"""One seeded chaos trial (``Trial``): the broker, the fleet, the deploy with its faults, the operator's recovery.

The steps are in ``chaos.py``. Here: the trial's broker (a private, persistent redis-server; or a RabbitMQ vhost,
the redis-server then keeping lease and fence), its config, the producers; the faults, fired when the deploy
reports their moment (its ``--json`` events) or right after a journal record (a kill, through
``celeryops_harness.killcli``); the operator's recovery as a person would run it (``status`` read in-process,
``resume`` / ``abort`` / ``abort --restore`` as the advice says); the exit code checks; then ``Verdict``.
"""

from __future__ import annotations

import contextlib
import json
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
from celeryops_harness.chaos_plan import (
    CANARY_FAIL_RATE,
    CANARY_MOMENTS,
    CLI_SIGNAL,
    WORKER_KILL,
    Fault,
    TrialPlan,
)
from celeryops_harness.chaos_procs import CliRun, TrialFleet, aof_redis_server
from celeryops_harness.chaos_quiet import QUIET_DEADLINE, quiet, unaccounted
from celeryops_harness.chaos_verdict import NEVER_CAME, TrialResult, Verdict
from celeryops_harness.workers import wait_for

if TYPE_CHECKING:
    from celeryops_harness.chaos import ChaosLab

RELEASE = "release-chaos"
PROJECT, REGION = "proj", "europe-west1"
#: Phases a run can be resumed from (after a kill before the drain finished, the operator resumes half of the time).
RESUMABLE = ("preflight", "stopping", "draining")
#: The canary trials' judge: a look a second, at least 30 canary tasks, the default alpha (1 %) and margin (5 %).
CANARY_TABLE = "\n[canary]\nlook_interval = 1\nmin_tasks = 30\nmax_duration = 60\n"
#: A canary trial's stream: a short ``work`` task every STREAM_EVERY s from the deploy's start until the recovery
#: ended (the analysis needs tasks on both revisions; a resume goes on judging them).
STREAM_SECONDS, STREAM_EVERY = 0.05, 0.1
#: Exit codes of a canary deploy or resume that ended by itself: promoted, rolled back, paused (inconclusive).
CANARY_ENDS = (0, 7, 8)


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
        self.canary = plan.strategy == "canary"  # a worker pool deployed with --strategy canary
        self.pool = self.overlap or self.canary  # a worker pool (else a service)
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
        self._looks = 0  # canary_look events the deploy reported
        self._stream_stop = threading.Event()
        self._stream: threading.Thread | None = None
        self._record: redis.Redis | None = None  # the record Redis, while the trial runs
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
            kind="cloudrun-worker-pool" if self.pool else "cloudrun-service")
            + (CANARY_TABLE if self.canary else ""))

    def enqueue(self, duration: float, task: Any = None) -> None:
        from celeryops_harness.taskapp import sleep

        task = task or sleep
        tid = str(uuid.uuid4())
        with self._broker_lock:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with task.app.connection_for_write(self.broker_url) as conn:
                        task.apply_async(args=(duration, tid[:8]), task_id=tid, queue=self.queue, connection=conn,
                                         retry=False)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        self.result.anomalies.append("a producer could not enqueue for 30 s")
                        return
                    time.sleep(0.2)
            self.ids.append(tid)

    # -- faults -------------------------------------------------------------------------------------------------

    def _stream_run(self) -> None:
        from celeryops_harness.taskapp import work

        while not self._stream_stop.is_set():
            self.enqueue(STREAM_SECONDS, work)
            self._stream_stop.wait(STREAM_EVERY)

    def start_stream(self) -> None:
        self._stream = threading.Thread(target=self._stream_run, daemon=True)
        self._stream.start()

    def stop_stream(self) -> None:
        self._stream_stop.set()
        if self._stream is not None:
            self._stream.join(40)

    def _unaccounted(self) -> list[str]:
        """The trial's tasks that are nowhere a kill leaves them (``chaos_quiet``): popped and on their way."""
        assert self.fleet is not None and self._record is not None
        return unaccounted(list(self.ids), self._record, self.broker.url, self.queue, self.fleet.workers)

    def _held_back(self) -> None:
        self.result.held_back += 1

    def _kill_worker(self, fault: Fault) -> bool:
        """SIGKILL a serving worker once no message is on its way to it (kombu#305, ``chaos_quiet``): the producers
        pause meanwhile. On RabbitMQ, which records a delivery as it makes it, at once."""
        assert self.fleet is not None
        if self.amqp:
            return bool(self.fleet.kill_one())
        with self._broker_lock:
            victim = self.fleet.victim()
            if victim is None:
                return False
            with quiet([victim], self._unaccounted, on_wait=self._held_back) as left:
                if not left:
                    self.fleet.kill(victim)
                    return True
        self.result.skipped.append(f"{fault.describe()}(no quiet moment: {len(left)} sent task(s) nowhere for "
                                   f"{QUIET_DEADLINE:g} s)")
        return False

    def _crash_broker(self, fault: Fault) -> bool:
        """Crash the broker once no message is on its way to a worker (kombu#305): every worker stopped meanwhile,
        the producers paused. The broker comes back ``fault.downtime`` later."""
        assert self.fleet is not None
        with self._broker_lock:
            workers = [] if self.amqp else self.fleet.alive()  # RabbitMQ brokers: the redis-server holds no task
            with quiet(workers, self._unaccounted if workers else list, on_wait=self._held_back) as left:
                if not left:
                    self.broker.stop()  # SIGKILL: a crash; the AOF (fsync always) keeps every acknowledged write
            if left:
                self.result.skipped.append(f"{fault.describe()}(no quiet moment: {len(left)} sent task(s) nowhere "
                                           f"for {QUIET_DEADLINE:g} s)")
                return False
            time.sleep(fault.downtime)  # the broker is down for a while (a fault's duration, not a wait)
            self.broker.start(timeout=30)
        return True

    def _fire(self, index: int, fault: Fault, late: bool = False) -> None:
        """Fire one fault; ``late``: its moment never came (the deploy ended first), so it hits the fleet now."""
        if index in self._fired:
            return
        self._fired.add(index)
        assert self.fleet is not None
        if fault.kind == CLI_SIGNAL:
            deploy = self._deploy
            if deploy is None or deploy.proc.poll() is not None:
                self.result.skipped.append(fault.describe())
                return
            deploy.proc.send_signal(getattr(signal, fault.sig))
            self.result.faults.append(f"{fault.describe()}(in {self._moment})")
            return
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
            if not self._kill_worker(fault):
                if not any(s.startswith(fault.describe()) for s in self.result.skipped):
                    self.result.skipped.append(fault.describe())
                return
        elif fault.kind == "redis_restart" and not self._crash_broker(fault):
            return
        self.result.faults.append(fault.describe() + (NEVER_CAME if late else ""))

    def _schedule(self, moment: str) -> None:
        for index, fault in enumerate(self.plan.faults):
            if fault.at == moment and index not in self._fired:
                timer = threading.Timer(fault.delay, self._fire, (index, fault))
                timer.daemon = True
                self._timers.append(timer)
                timer.start()

    def _on_canary_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "overlap" and event.get("step") in CANARY_MOMENTS:
            self._moment = str(event["step"])
            self._schedule(self._moment)
        elif kind == "canary_look":
            self._looks += 1
            self._moment = f"look{self._looks}"
            for index, fault in enumerate(self.plan.faults):
                if fault.at == "canary_look" and fault.look == self._looks and index not in self._fired:
                    timer = threading.Timer(fault.delay, self._fire, (index, fault))
                    timer.daemon = True
                    self._timers.append(timer)
                    timer.start()

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if self.canary:
            self._on_canary_event(event)
            return
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
        with contextlib.suppress(OSError), (self.dir / "commands.jsonl").open("a") as out:  # kept with the logs
            out.write(json.dumps({"args": args, "rc": rc, "events": run.events, "stderr": run.stderr}) + "\n")
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
            if not resumed and (run.phase in RESUMABLE or self.pool):  # a pool's run resumes from any step
                resumed = True
                rc, _, err = self.cli("resume")
                # A deploy run resumes through its deploy: a pending failed rollout then exits 6, as a deploy does.
                # A canary's resume ends as its deploy does: promoted, rolled back, or paused again (left open).
                ok = set(CANARY_ENDS) if self.canary else {0, 6} if self.plan.has("fail_rollout") else {0}
                if rc not in ok:
                    self.result.anomalies.append(f"resume exited {rc}: {err.strip()[-200:]}")
                continue
            rc, events, err = self.cli("abort")
            action = next((e.get("action") for e in events if e.get("event") == "abort"), None)
            if self.canary:
                # A canary still busy is held (it takes no task) and abort says: run `celeryops abort` again once it
                # is idle. Follow that; anything else is a finding. Taken away or held, no worker of the new
                # revision may consume once abort returned.
                if rc != 0 and action != "ask":
                    self.result.anomalies.append(f"abort exited {rc}: {err.strip()[-200:]}")
                if action in ("retire", "ask"):
                    self.result.canary_consuming.extend(f"after abort ({action}): {c}"
                                                        for c in self.canary_consumers())
                continue
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
        record = self._record = redis.Redis.from_url(self.lab.record.url, decode_responses=True)
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
            keep = self.lab.keep_logs or not (self.result.ok and not self.result.anomalies)
            if keep:
                self._keep_broker_files()
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

    def _keep_broker_files(self) -> None:
        """The broker's append-only file and log, next to the trial's other logs (what the broker last held)."""
        self.broker.stop()  # its files complete
        with contextlib.suppress(OSError):
            for name in ("appendonlydir", "redis.log"):
                src = self.broker.data_dir / name
                if src.is_dir():
                    shutil.copytree(src, self.dir / f"broker-{name}", dirs_exist_ok=True)
                elif src.exists():
                    shutil.copy2(src, self.dir / f"broker-{name}")

    def _run(self, record: redis.Redis) -> None:
        plan, lab = self.plan, self.lab
        self.broker.start(timeout=30)
        if lab.broker == "amqp":
            self.amqp = create_vhost(self.tag)
        self.fleet = TrialFleet(self.broker_url, lab.record.url, self.queue, self.dir, kind=lab.fleet,
                                fleet=f"chaos-{self.tag}", coord=self.broker.url if self.amqp else "",
                                events=self.canary, new_env={"CELERYOPS_TEST_FAIL_RATE": f"{CANARY_FAIL_RATE:g}"}
                                if self.canary and plan.release == "bad" else None)
        self.fleet.ids = self.ids  # what it checks for tasks still running on an instance taken away
        lab.route(self.service, self.fleet)  # the resource's two instances: real workers of its first revision
        add = lab.standin.add_worker_pool if self.pool else lab.standin.add_service
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
        from celeryops_harness.taskapp import sleep, work

        late_task = work if self.canary else sleep  # a canary's: they run on either revision, and may fail there
        producers = [threading.Timer(at, self.enqueue, (seconds, late_task)) for at, seconds in plan.late]
        for p in producers:
            p.daemon = True
            p.start()
        strategy = ["--strategy", plan.strategy] if self.pool else []
        if self.canary:
            self.start_stream()
        self._deploy = CliRun(["deploy", RELEASE, *strategy, "--yes", "--accept-warnings", "--json", "--repo",
                               str(lab.git.work)], self.env(), self.dir, self._on_event,
                               kill_after=kill.point if kill is not None else None)
        rc = self._deploy.wait(180)
        self.result.commands.append(("deploy", rc))
        (self.dir / "deploy.stderr").write_text(self._deploy.stderr)  # kept with the logs of a failing trial
        (self.dir / "deploy.jsonl").write_text("".join(json.dumps(e) + "\n" for e in self._deploy.events))
        self._mark("deploy")
        # Timed faults whose moment never came still hit the fleet (during the recovery), except a SIGINT: marked so.
        for index, fault in enumerate(plan.faults):
            if fault.at and index not in self._fired and fault.kind != "sigint":
                self._fire(index, fault, late=True)
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
        for fault in plan.faults:  # a SIGINT that landed is listed with the step it landed in: "...(in draining)"
            if fault.kind == "sigint" and not any(f.startswith(fault.describe()) for f in self.result.faults):
                self.result.skipped.append(fault.describe())
        if self.canary:
            self._canary_recovery(rc)
        else:
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
        if self.pool:  # the overlap's (and canary's) promise: no instance is taken away while it runs a task
            self.result.anomalies.extend(f"taken away busy: {b}" for b in self.result.busy)
        self.verdict(record)

    # -- canary trials ------------------------------------------------------------------------------------------

    def _canary_recovery(self, rc: int) -> None:
        """A canary trial after its deploy exited ``rc``: the exit code its signal (or none) calls for, the
        operator's recovery (``abort`` or ``resume`` as drawn) while the stream flows, then where the pool ended:
        on its old revision at its count with no worker of the new revision consuming (rolled back, or the canary
        taken away), or on the new one at its count (promoted)."""
        (fault,) = self.plan.faults
        fired = any(f.startswith(fault.sig + "@") for f in self.result.faults)
        if fired and fault.lost and rc == -signal.SIGKILL:
            self.result.faults[-1] += "+lost_machine"
            self.lose_machine()
        if not fired:
            expected = set(CANARY_ENDS)
        elif fault.sig == "SIGKILL":
            expected = {-signal.SIGKILL}
        else:
            expected = {130, *CANARY_ENDS}  # the signal may land after the flow finished
        if rc not in expected:
            tail = self._deploy.stderr.strip()[-300:] if self._deploy is not None else ""
            self.result.anomalies.append(f"deploy exited {rc}, expected {sorted(expected)}: {tail}")
        self.result.verdicts = [str(e.get("verdict")) for e in (self._deploy.events if self._deploy else [])
                                if e.get("event") == "canary_look" and e.get("verdict") in ("promote", "rollback")]
        if rc not in (0, 7):
            self.recover(fault.then if fired else "abort")
        self.lab.standin.wait_rollouts(60)
        ending = self._pool_ending()
        self.result.ending = {self._first_short(): "old", self._new_short(): "new"}.get(ending, ending)
        if self.result.ending == "old":
            self.result.canary_consuming.extend(f"at the end: {c}" for c in self.canary_consumers())
        elif self.result.ending != "new":
            self.result.anomalies.append(f"the pool ended on {ending}, neither revision alone at its count")
        if not fired and self.result.verdicts:
            wanted = "rollback" if self.plan.release == "bad" else "promote"
            if self.result.verdicts[-1] != wanted:
                self.result.anomalies.append(f"a {self.plan.release} release got the verdict "
                                             f"{self.result.verdicts[-1]}")
        self.stop_stream()

    def _first_short(self) -> str:
        return self._first_revision.rsplit("/", 1)[-1]

    def _new_short(self) -> str:
        names = [r.name.rsplit("/", 1)[-1] for r in self.lab.standin.revisions(self.service)]
        later = [n for n in names if n != self._first_short()]
        return later[-1] if later else ""

    def _pool_ending(self) -> str:
        """``<revision>`` when the pool runs only that revision at its original count (2), else a description."""
        found = {rev.rsplit("/", 1)[-1]: len(found) for rev, found in
                 self.lab.standin.instances(self.service).items() if found}
        if len(found) == 1 and next(iter(found.values())) == 2:
            return next(iter(found))
        return ", ".join(f"{rev} x{n}" for rev, n in sorted(found.items())) or "no instance"

    def canary_consumers(self) -> list[str]:
        """Workers of the new revision that still consume once the canary was taken away: a live one that is not
        on its way out (SIGTERMed by the stand-in) whose active_queues name the queue, or whose fence registry
        entry says it consumes. Waits (bounded) for the stand-in's SIGTERMed instances to leave first."""
        from celeryops.fence.registry import plugin_workers

        assert self.fleet is not None
        fleet, new = self.fleet, self._new_short()
        if not new:
            return []
        leaving = {w.nodename for w in fleet.leaving()}
        live = [w for w in fleet.of_revision(new) if w.alive() and w.nodename not in leaving]
        found: list[str] = []
        if live:
            names = [w.nodename for w in live]
            try:
                replies = fleet.app.control.inspect(destination=names, timeout=3,
                                                    limit=len(names)).active_queues() or {}
            except Exception as exc:
                self.result.anomalies.append(f"active_queues of the new revision's workers failed: {exc}")
                replies = {}
            found += [f"{w} consumes {self.queue}" for w, qs in replies.items()
                      if self.queue in {q["name"] for q in qs or []}]
        client = redis.Redis.from_url(self.broker.url, socket_timeout=5, decode_responses=True)
        try:
            entries = plugin_workers(client, f"chaos-{self.tag}")
        except redis.RedisError as exc:
            self.result.anomalies.append(f"could not read the fence registry: {exc}")
            entries = {}
        finally:
            client.close()
        alive = {w.nodename for w in live}
        found += [f"{info.hostname} listed consuming in the fence registry" for info in entries.values()
                  if info.revision.rsplit("/", 1)[-1] == new and not info.held and info.hostname in alive]
        return sorted(set(found))

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
