"""Every duration of the demo, derived from ``--speed`` (1.0: a full deploy of the demo takes about a minute).

Task durations, the producer's pace, the autoscaler's poll, the drain settings and the Cloud Run rollout are all
divided by the speed; a few floors keep the control traffic sane on a busy machine at high speeds.
"""

from __future__ import annotations

from dataclasses import dataclass

from celeryops.core.errors import EXIT_USAGE, UserError

MIN_SPEED = 0.1
MAX_SPEED = 50.0


class _Scaled:
    """A duration of the demo: ``seconds`` at speed 1, divided by the speed, never under ``floor``."""

    def __init__(self, seconds: float, floor: float) -> None:
        self.seconds, self.floor = seconds, floor

    def __get__(self, timing: Timing, owner: type | None = None) -> float:
        return timing.scaled(self.seconds, floor=self.floor)


class _Span:
    """A range of durations of the demo, (low, high) seconds at speed 1, divided by the speed."""

    def __init__(self, low: float, high: float) -> None:
        self.low, self.high = low, high

    def __get__(self, timing: Timing, owner: type | None = None) -> tuple[float, float]:
        return timing.span(self.low, self.high)


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
    short_task = _Span(0.5, 3.0)
    long_task = _Span(20.0, 40.0)  # the "runs for minutes in production" tasks that a drain must wait for
    cpu_task = _Span(4.0, 10.0)
    gpu_task = _Span(6.0, 12.0)
    eta_countdown = _Span(30.0, 60.0)  # how far off the ETA (countdown) task is due: it sits in a worker's timer
    slot_retry = _Scaled(4.0, floor=0.5)

    # -- producer and autoscaler
    produce_every = _Scaled(1.5, floor=0.05)
    autoscale_every = _Scaled(2.0, floor=0.25)

    # -- drain, fence, rollout
    drain_interval = _Scaled(2.0, floor=0.3)
    drain_max_wait = _Scaled(600.0, floor=120.0)
    fence_interval = _Scaled(2.0, floor=0.3)
    rollout = _Scaled(3.0, floor=0.2)
