"""What a chaos trial will do, drawn from its seed alone: the faults (``Fault``) and the tasks (``TrialPlan``).

The same seed replays the same trial. The fault kinds: a worker scales out; the deploy gets SIGKILL right after a
journal record (``KILL_POINTS``; then the operator's first recovery command, and maybe the operator's machine lost
with it), or SIGINT; the broker crashes and comes back; an old worker is SIGTERMed only after the new revision is
up; the rollout fails. Timed faults fire a random delay after the deploy reports one of ``MOMENTS``. A worker
SIGKILL (``WORKER_KILL``) and the lost machine are drawn from their own random streams, so adding them left the
other draws of every seed as they were.
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

    def describe(self) -> str:
        if self.kind == "kill":
            return f"{'lost_machine' if self.lost else 'kill'}@{self.point}->{self.then}"
        if self.kind in ("sigint", "scale_out", "redis_restart"):
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

    @classmethod
    def draw(cls, seed: int) -> TrialPlan:
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

    def has(self, kind: str) -> Fault | None:
        return next((f for f in self.faults if f.kind == kind), None)


def machine_lost(seed: int) -> bool:
    """Whether a trial's kill also loses the operator's machine with its state dir (the recovery then runs from a
    fresh state dir: a teammate with only the broker). Its own random stream: the seeds' other draws stay as they
    were."""
    return random.Random(f"lost_machine:{seed}").random() < 0.5
