"""The drain verdict is a pure function of observations and a clock: tested without any I/O."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from celeryops.core.events import Observation, WorkerObs
from celeryops.ops.drain.engine import DrainSettings, PolicyState, judge

S = DrainSettings(interval=15, streak=2, max_wait=1200)


def obs(*workers: WorkerObs) -> Observation:
    return Observation(workers={w.name: w for w in workers})


def test_empty_means_every_known_worker_replied_and_nothing_active_or_reserved() -> None:
    idle = WorkerObs("a", replied=True)
    assert obs(idle).empty
    assert not obs(idle, WorkerObs("b", replied=False)).empty  # unknown is never zero
    assert not obs(WorkerObs("a", replied=True, active=1)).empty
    assert not obs(WorkerObs("a", replied=True, reserved=1)).empty  # prefetched tasks still run
    assert obs(WorkerObs("a", replied=True, scheduled=3)).empty  # ETA tasks are warned about, not waited for
    assert obs(WorkerObs("a", replied=False, state="gone")).empty  # left the fleet cleanly


def test_streak_in_a_row_then_drained() -> None:
    state = PolicyState(started=0.0)
    state, v = judge(S, state, True, 15)
    assert (v.status, v.streak) == ("continue", 1)
    state, v = judge(S, state, True, 30)
    assert (v.status, v.streak) == ("drained", 2)


def test_any_non_empty_observation_resets_the_streak() -> None:
    state = PolicyState(started=0.0)
    state, _ = judge(S, state, True, 15)
    state, v = judge(S, state, False, 30)
    assert (v.status, v.streak) == ("continue", 0)
    state, v = judge(S, state, True, 45)
    assert (v.status, v.streak) == ("continue", 1)


def test_timeout_at_max_wait_but_drained_wins_on_the_same_poll() -> None:
    _, v = judge(S, PolicyState(started=0.0, streak=1), True, 1200)
    assert v.status == "drained"
    _, v = judge(S, PolicyState(started=0.0, streak=1), False, 1200)
    assert (v.status, v.remaining) == ("timeout", 0.0)


@given(st.lists(st.tuples(st.booleans(), st.floats(min_value=0.0, max_value=100.0)), min_size=1, max_size=60),
       st.integers(min_value=1, max_value=5))
def test_drained_only_after_streak_empty_observations_in_a_row(steps: list[tuple[bool, float]], streak: int) -> None:
    settings = DrainSettings(interval=1, streak=streak, max_wait=10_000)
    state, now, run = PolicyState(started=0.0), 0.0, 0
    for empty, dt in steps:
        now += dt
        state, verdict = judge(settings, state, empty, now)
        run = run + 1 if empty else 0
        assert verdict.streak == run
        assert (verdict.status == "drained") == (run >= streak)
        assert verdict.remaining == max(0.0, 10_000 - now) or verdict.status == "timeout"
        if verdict.status != "continue":
            break
