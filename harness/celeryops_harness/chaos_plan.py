"""What a chaos trial will do, drawn from its seed alone: the faults (``Fault``) and the tasks (``TrialPlan``).

The same seed replays the same trial. The fault kinds: a worker scales out; the deploy gets SIGKILL right after a
journal record (``KILL_POINTS``; then the operator's first recovery command, and maybe the operator's machine lost
with it), or SIGINT; the broker crashes and comes back; an old worker is SIGTERMed only after the new revision is
up; the rollout fails. Timed faults fire a random delay after the deploy reports one of ``MOMENTS``. A worker
SIGKILL (``WORKER_KILL``) and the lost machine are drawn from their own random streams, so adding them left the
other draws of every seed as they were.

Overlap trials (``strategy="overlap"``, a Cloud Run worker pool deployed with ``--strategy overlap``, issue 19) draw
from their own lists: the deploy SIGKILLed right after each write-ahead record of the overlap flow
(``OVERLAP_KILL_POINTS``) or SIGINTed at one of its steps (``OVERLAP_MOMENTS``), the broker restarted, the new
revision failing to start, the old instances taken away late; a worker SIGKILLed as above. A worker pool has no
autoscaler: no scale-out.

Canary trials (``strategy="canary"``, a worker pool deployed with ``--strategy canary``, issue 28): a steady stream
of ``work`` tasks flows through the deploy and its recovery, the release is bad (its instances fail a fifth of
their tasks: rolled back by the analysis) or good (promoted), and the deploy process gets SIGINT, SIGTERM or SIGKILL
(``CANARY_SIGNALS``) a random delay after it reports one of ``CANARY_MOMENTS`` (``canary_look``: its first, second
or third look); then the operator's ``abort`` or ``resume``. A moment only one verdict reaches decides the release:
``stopping_old`` and ``cutting_over`` come after a promotion (a good release), ``retiring`` after a rollback (a bad
one).

Autoscale trials (``strategy="autoscale"``, a worker pool sized by ``celeryops autoscale``, issue 36): bursts of
tasks make the autoscaler add cohorts and take idle ones away; the autoscaler gets SIGKILL or SIGINT right after one
of the journal records its steps write (``AUTOSCALE_RECORDS``; seeds 1-26 take every record with both signals, in
turn), then, after a SIGKILL, the operator's ``abort``, ``resume`` or the next ``autoscale`` (maybe from a teammate's
machine); and maybe a worker SIGKILLed, the broker restarted, a deploy started, each a random delay after the
autoscaler reports one of its steps (``AUTOSCALE_MOMENTS``), drawn from streams of their own.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

FAULT_KINDS = ("scale_out", "kill", "sigint", "redis_restart", "late_sigterm", "fail_rollout")
#: Drawn apart from FAULT_KINDS (its own random stream, so the seeds above replay the same trials plus this):
#: a worker SIGKILLed before the deploy starts, or while it drains (OOM; Cloud Run's SIGKILL 10 s after SIGTERM).
#: Its pidbox binding stays in Redis: the drain must see it gone by evidence, not time out on it.
WORKER_KILL = "worker_kill"
WORKER_KILL_MOMENTS = ("before", "draining")
#: Journal records the deploy can be SIGKILLed right after (celeryops_harness.killcli).
KILL_POINTS = ("created", "phase:stopping", "intent:cancel_consumers", "phase:draining", "phase:drained",
               "phase:deploying", "intent:deploy_start", "settle:deploy_start", "phase:deployed")
#: Moments a timed fault waits for, as seen in the deploy's --json events.
MOMENTS = ("preflight", "draining", "drained", "deploying")

STRATEGIES = ("drain", "overlap", "canary", "autoscale")
OVERLAP_FAULT_KINDS = ("kill", "sigint", "redis_restart", "fail_rollout", "late_sigterm")
#: The first fault of an overlap trial is drawn with these weights (a kill most often: six points to cover).
OVERLAP_WEIGHTS = (6, 3, 3, 1, 1)
#: The overlap flow's write-ahead records (``intent:overlap_revert`` is reached only when the new revision is
#: retired: a trial killed there also gets a new revision that fails to start).
OVERLAP_KILL_POINTS = ("intent:overlap_up", "settle:overlap_up", "intent:cancel_consumers", "phase:drained",
                       "intent:overlap_cutover", "intent:overlap_revert")
#: The steps of an overlap deploy a timed fault waits for (its --json ``overlap`` steps, ``poll``, ``drained``).
OVERLAP_MOMENTS = ("scaling_up", "consuming", "draining", "drained", "cutting_over")


#: The signals a canary trial sends its deploy process, and the steps it sends them at (``canary_look``: a look).
CANARY_SIGNALS = ("SIGINT", "SIGTERM", "SIGKILL")
CANARY_MOMENTS = ("scaling_up", "consuming", "canary_look", "stopping_old", "cutting_over", "retiring")
#: The fault kind of a canary trial: a signal to the deploy process (``sig``) at a moment (``at``).
CLI_SIGNAL = "cli_signal"
#: Releases: ``bad`` (its instances fail CANARY_FAIL_RATE of their tasks), ``good`` (alike on both revisions).
CANARY_RELEASES = ("bad", "good")
CANARY_FAIL_RATE = 0.2

#: The journal records an autoscaler's steps write, in order: a scale-out (``created``, then the pool update), then a
#: scale-in (its cohort stopped, drained and held, the pool update, its remaining workers given back). ``A>B``: the
#: first B after an A (a scale-in's pool update, not the scale-out's before it). killcli kills at the first one.
AUTOSCALE_RECORDS = ("created", "phase:scaling", "intent:scale_pool", "settle:scale_pool", "phase:done",
                     "phase:stopping", "intent:cancel_consumers", "phase:draining", "phase:drained",
                     "phase:drained>intent:scale_pool", "phase:drained>settle:scale_pool", "intent:add_consumers",
                     "phase:drained>phase:done")
#: The fault kind of an autoscale trial's interruption: a signal (``sig``) to the autoscaler right after a journal
#: record (``point``); after a SIGKILL the operator's ``then``.
RECORD_SIGNAL = "record_signal"
AUTOSCALE_SIGNALS = ("SIGKILL", "SIGINT")
AUTOSCALE_RECOVERY = ("autoscale", "abort", "resume")
#: The autoscaler's steps (its --json ``autoscale_step``) a timed fault waits for.
AUTOSCALE_MOMENTS = ("adding", "added", "draining", "drained", "removing", "removed")
#: The timed faults of an autoscale trial, each drawn apart with its chance: a worker SIGKILLed, the broker
#: restarted, a deploy started.
AUTOSCALE_EXTRAS = ((WORKER_KILL, 0.35), ("redis_restart", 0.3), ("deploy", 0.3))


@dataclass(frozen=True)
class Fault:
    """One fault of a trial. ``at``/``delay``: fire ``delay`` s after the deploy reported ``at`` (timed faults);
    ``point``: the journal record a kill follows; ``then``: the operator's first recovery command after a kill."""

    kind: str
    at: str = ""
    delay: float = 0.0
    point: str = ""
    then: str = ""
    downtime: float = 0.0
    lost: bool = False  # a kill that also loses the operator's machine: its state dir is deleted before recovery
    sig: str = ""  # CLI_SIGNAL: SIGINT, SIGTERM or SIGKILL
    look: int = 0  # CLI_SIGNAL at canary_look: which look (1-based)

    def describe(self) -> str:
        if self.kind == RECORD_SIGNAL:
            then = f"->{self.then}" if self.sig == "SIGKILL" else ""
            return f"{self.sig}@{self.point}{then}" + ("+lost_machine" if self.lost else "")
        if self.kind == CLI_SIGNAL:
            at = f"look{self.look}" if self.at == "canary_look" else self.at
            return f"{self.sig}@{at}+{self.delay:.1f}s->{self.then}"
        if self.kind == "kill":
            return f"{'lost_machine' if self.lost else 'kill'}@{self.point}->{self.then}"
        if self.kind in ("sigint", "scale_out", "redis_restart", "deploy"):
            extra = f",down {self.downtime:.1f}s" if self.kind == "redis_restart" else ""
            return f"{self.kind}@{self.at}+{self.delay:.1f}s{extra}"
        if self.kind == "late_sigterm":
            return f"late_sigterm+{self.delay:.1f}s"
        if self.kind == WORKER_KILL:
            return f"{WORKER_KILL}@{self.at}" + (f"+{self.delay:.1f}s" if self.at != "before" else "")
        return self.kind


@dataclass(frozen=True)
class TrialPlan:
    """Everything random about a trial, drawn from its seed alone (the same seed replays the same trial)."""

    seed: int
    early: tuple[float, ...]  # durations of the tasks enqueued before the deploy
    late: tuple[tuple[float, float], ...]  # (seconds after the deploy started, duration) of the others
    faults: tuple[Fault, ...]
    strategy: str = "drain"
    release: str = ""  # canary trials: CANARY_RELEASES
    min_instances: int = 1  # autoscale trials: [autoscale] min_instances (0 or 1)

    @classmethod
    def draw(cls, seed: int, strategy: str = "drain") -> TrialPlan:
        if strategy == "overlap":
            return cls.draw_overlap(seed)
        if strategy == "canary":
            return cls.draw_canary(seed)
        if strategy == "autoscale":
            return cls.draw_autoscale(seed)
        rng = random.Random(seed)

        def duration() -> float:
            return round(rng.uniform(0.1, 0.5) if rng.random() < 0.6 else rng.uniform(1.0, 2.5), 2)

        early = tuple(duration() for _ in range(rng.randint(4, 8)))
        late = tuple((round(rng.uniform(0.0, 6.0), 2), duration()) for _ in range(rng.randint(0, 4)))
        kinds = rng.sample(FAULT_KINDS, rng.choice((1, 1, 2, 2, 3)))
        if "kill" in kinds and "sigint" in kinds:  # one interruption of the deploy process per trial
            kinds.remove(rng.choice(("kill", "sigint")))
        faults = []
        for kind in kinds:
            if kind == "kill":
                faults.append(Fault(kind, point=rng.choice(KILL_POINTS), then=rng.choice(("abort", "resume")),
                                    lost=machine_lost(seed)))
            elif kind in ("sigint", "scale_out", "redis_restart"):
                faults.append(Fault(kind, at=rng.choice(MOMENTS), delay=round(rng.uniform(0.0, 1.5), 2),
                                    downtime=round(rng.uniform(0.2, 1.5), 2) if kind == "redis_restart" else 0.0))
            elif kind == "late_sigterm":
                faults.append(Fault(kind, delay=round(rng.uniform(0.0, 1.5), 2)))
            else:
                faults.append(Fault(kind))
        extra = random.Random(f"{WORKER_KILL}:{seed}")
        if extra.random() < 0.4:
            faults.append(Fault(WORKER_KILL, at=extra.choice(WORKER_KILL_MOMENTS), delay=round(extra.uniform(0, 1), 2)))
        return cls(seed, early, late, tuple(faults))

    @classmethod
    def draw_overlap(cls, seed: int) -> TrialPlan:
        """An overlap trial: long and short tasks before the deploy, short ones while it runs (the producers do not
        stop for a deploy), one or two faults of ``OVERLAP_FAULT_KINDS``, maybe a worker SIGKILL."""
        rng = random.Random(f"overlap:{seed}")

        def duration() -> float:  # long ones outlast the scale-up: the old revision's drain waits for them
            return round(rng.uniform(0.1, 0.5) if rng.random() < 0.6 else rng.uniform(2.0, 8.0), 2)

        early = tuple(duration() for _ in range(rng.randint(4, 8)))
        late = tuple((round(rng.uniform(0.0, 10.0), 2), duration()) for _ in range(rng.randint(3, 8)))
        kinds = rng.choices(OVERLAP_FAULT_KINDS, weights=OVERLAP_WEIGHTS)
        if rng.random() < 0.4:
            others = [k for k in OVERLAP_FAULT_KINDS if k not in kinds and not {k, *kinds} >= {"kill", "sigint"}]
            kinds.append(rng.choice(others))
        faults = []
        for kind in kinds:
            if kind == "kill":
                point = rng.choice(OVERLAP_KILL_POINTS)
                faults.append(Fault(kind, point=point, then=rng.choice(("abort", "resume")), lost=machine_lost(seed)))
                if point == "intent:overlap_revert" and "fail_rollout" not in kinds:
                    faults.append(Fault("fail_rollout"))
            elif kind in ("sigint", "redis_restart"):
                faults.append(Fault(kind, at=rng.choice(OVERLAP_MOMENTS), delay=round(rng.uniform(0.0, 1.5), 2),
                                    downtime=round(rng.uniform(0.2, 1.5), 2) if kind == "redis_restart" else 0.0))
            elif kind == "late_sigterm":
                faults.append(Fault(kind, delay=round(rng.uniform(0.0, 1.5), 2)))
            else:
                faults.append(Fault(kind))
        extra = random.Random(f"overlap:{WORKER_KILL}:{seed}")
        if extra.random() < 0.35:
            faults.append(Fault(WORKER_KILL, at=extra.choice(WORKER_KILL_MOMENTS), delay=round(extra.uniform(0, 1), 2)))
        return cls(seed, early, late, tuple(faults), "overlap")

    @classmethod
    def draw_canary(cls, seed: int) -> TrialPlan:
        """A canary trial: a few tasks of 1-4 s before the deploy and while it runs (``work`` ones then: the canary
        or the old revision may be busy when it is held or drained), a steady stream of short ``work`` tasks (the
        trial's, not drawn), a bad or good release, and one signal to the deploy process at one of
        ``CANARY_MOMENTS``, then ``abort`` or ``resume``."""
        rng = random.Random(f"canary:{seed}")
        early = tuple(round(rng.uniform(1.0, 4.0), 2) for _ in range(rng.randint(2, 5)))
        late = tuple((round(rng.uniform(0.0, 30.0), 2), round(rng.uniform(1.0, 4.0), 2))
                     for _ in range(rng.randint(2, 5)))
        at = rng.choice(CANARY_MOMENTS)
        sig = rng.choice(CANARY_SIGNALS)
        delay = round(rng.uniform(0.0, 1.0), 2)
        look = rng.randint(1, 3) if at == "canary_look" else 0
        then = rng.choice(("abort", "resume"))
        release = rng.choice(CANARY_RELEASES)
        if at in ("stopping_old", "cutting_over"):
            release = "good"
        elif at == "retiring":
            release = "bad"
        fault = Fault(CLI_SIGNAL, at=at, delay=delay, then=then, sig=sig, look=look,
                      lost=sig == "SIGKILL" and machine_lost(seed))
        return cls(seed, early, late, (fault,), "canary", release)

    @classmethod
    def draw_autoscale(cls, seed: int) -> TrialPlan:
        """An autoscale trial: a burst of 1-4 s tasks once the autoscaler looked and another while it runs, the
        interruption (the seed takes the records and signals in turn: seeds 1-26 cover each once), and each of
        ``AUTOSCALE_EXTRAS`` with its chance at one of ``AUTOSCALE_MOMENTS``."""
        rng = random.Random(f"autoscale:{seed}")
        early = tuple(round(rng.uniform(1.0, 4.0), 2) for _ in range(rng.randint(4, 8)))
        late = tuple((round(rng.uniform(6.0, 20.0), 2), round(rng.uniform(1.0, 4.0), 2))
                     for _ in range(rng.randint(2, 6)))
        turn = (seed - 1) % (len(AUTOSCALE_RECORDS) * len(AUTOSCALE_SIGNALS))
        sig = AUTOSCALE_SIGNALS[turn // len(AUTOSCALE_RECORDS)]
        faults = [Fault(RECORD_SIGNAL, point=AUTOSCALE_RECORDS[turn % len(AUTOSCALE_RECORDS)], sig=sig,
                        then=rng.choice(AUTOSCALE_RECOVERY) if sig == "SIGKILL" else "",
                        lost=sig == "SIGKILL" and machine_lost(seed))]
        for kind, chance in AUTOSCALE_EXTRAS:
            extra = random.Random(f"autoscale:{kind}:{seed}")
            if extra.random() < chance:
                faults.append(Fault(kind, at=extra.choice(AUTOSCALE_MOMENTS), delay=round(extra.uniform(0.0, 1.0), 2),
                                    downtime=round(extra.uniform(0.2, 1.5), 2) if kind == "redis_restart" else 0.0))
        return cls(seed, early, late, tuple(faults), "autoscale", min_instances=rng.choice((0, 1)))

    def has(self, kind: str) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind), None)


def machine_lost(seed: int) -> bool:
    """Whether a trial's kill also loses the operator's machine with its state dir (the recovery then runs from a
    fresh state dir: a teammate with only the broker). Its own random stream: the seeds' other draws stay as they
    were."""
    return random.Random(f"lost_machine:{seed}").random() < 0.5
