"""Every duration of the demo, derived from ``--speed`` (1.0: a full deploy of the demo takes about a minute).

Task durations, the producer's pace, the autoscaler's poll, the drain settings and the Cloud Run rollout are all
divided by the speed; a few floors keep the control traffic sane on a busy machine at high speeds.
"""

from __future__ import annotations

from dataclasses import dataclass

from celeryops.core.errors import EXIT_USAGE, UserError

MIN_SPEED = 0.1
MAX_SPEED = 50.0


@dataclass(frozen=True)
class Timing:
    """Seconds for one demo speed. Ranges are (low, high) for a uniformly random duration."""

    speed: float = 1.0

    def __post_init__(self) -> None:
        if not MIN_SPEED <= self.speed <= MAX_SPEED:
            raise UserError(f"--speed must be between {MIN_SPEED:g} and {MAX_SPEED:g}, not {self.speed:g}: nothing "
                            "was started; pick a speed in that range (1 = a deploy takes about a minute).",
                            EXIT_USAGE)

    def scaled(self, seconds: float, floor: float = 0.0) -> float:
        return max(floor, seconds / self.speed)

    def span(self, low: float, high: float) -> tuple[float, float]:
        return (low / self.speed, high / self.speed)

    # -- tasks
    @property
    def short_task(self) -> tuple[float, float]:
        return self.span(0.5, 3.0)

    @property
    def long_task(self) -> tuple[float, float]:
        """The "runs for minutes in production" tasks that a drain must wait for."""
        return self.span(20.0, 40.0)

    @property
    def cpu_task(self) -> tuple[float, float]:
        return self.span(4.0, 10.0)

    @property
    def gpu_task(self) -> tuple[float, float]:
        return self.span(6.0, 12.0)

    @property
    def eta_countdown(self) -> tuple[float, float]:
        """How far in the future the ETA (countdown) task is due: it sits in a worker's timer meanwhile."""
        return self.span(30.0, 60.0)

    @property
    def slot_retry(self) -> float:
        return self.scaled(4.0, floor=0.5)

    # -- producer and autoscaler
    @property
    def produce_every(self) -> float:
        return self.scaled(1.5, floor=0.05)

    @property
    def autoscale_every(self) -> float:
        return self.scaled(2.0, floor=0.25)

    # -- drain, fence, rollout
    @property
    def drain_interval(self) -> float:
        return self.scaled(2.0, floor=0.3)

    @property
    def drain_max_wait(self) -> float:
        return self.scaled(600.0, floor=120.0)

    @property
    def fence_interval(self) -> float:
        return self.scaled(2.0, floor=0.3)

    @property
    def rollout(self) -> float:
        return self.scaled(3.0, floor=0.2)
