"""Issue 36: the autoscaler's pure decision. Properties over any look: the count asked stays within the bounds, a
scale-out only when more is needed, and a scale-in never picks a busy, silent or starting cohort, never goes below
what is needed, and only after ``idle_after`` seconds of surplus."""

from __future__ import annotations

import math

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from celeryops.core.autoscale import AutoscaleSettings
from celeryops.ops.autoscale.policy import Cohort, Look, Memory, QueueDemand, Trace, choose, decide, needed


@st.composite
def cohorts(draw: st.DrawFn) -> tuple[Cohort, ...]:
    n = draw(st.integers(0, 6))
    out = []
    for i in range(n):
        count = draw(st.integers(0, 8))
        live = draw(st.integers(0, count + 1))
        busy = draw(st.integers(0, live))
        out.append(Cohort(f"pool-c{i}", count, live=live, busy=busy, scheduled=draw(st.integers(0, 2)),
                          held=draw(st.booleans())))
    return tuple(out)


@st.composite
def looks(draw: st.DrawFn) -> Look:
    ready = st.one_of(st.none(), st.integers(0, 200))
    demand = tuple(QueueDemand(f"q{i}", draw(ready), draw(st.integers(0, 20)), draw(st.integers(0, 20)),
                               draw(st.integers(0, 5))) for i in range(draw(st.integers(0, 3))))
    return Look(at=draw(st.floats(0, 1e6)), demand=demand, per_instance=draw(st.integers(0, 8)),
                cohorts=draw(cohorts()))


@st.composite
def bounds(draw: st.DrawFn) -> AutoscaleSettings:
    low = draw(st.integers(0, 10))
    high = draw(st.integers(max(1, low), 40))
    return AutoscaleSettings(min_instances=low, max_instances=high, idle_after=draw(st.floats(0, 600)),
                             max_step=draw(st.integers(0, 5)))


@given(looks(), bounds(), st.one_of(st.none(), st.floats(0, 1e6)))
@settings(max_examples=400, deadline=None)
def test_decisions_keep_every_rule(look: Look, config: AutoscaleSettings, since: float | None) -> None:
    assume(since is None or since <= look.at)
    decision, memory = decide(look, config, Memory(since))
    want = needed(look, config)
    assert config.min_instances <= want <= config.max_instances
    raw = math.ceil(look.tasks / max(1, look.per_instance))
    assert want == max(config.min_instances, min(config.max_instances, raw))
    assert decision.reason.endswith(".") and "\n" not in decision.reason
    assert (decision.desired, decision.current) == (want, look.instances)
    if decision.action == "out":
        assert want > look.instances and decision.add >= 1
        assert look.instances + decision.add <= config.max_instances
        assert config.max_step == 0 or decision.add <= config.max_step
        assert memory.surplus_since is None
    elif decision.action == "in":
        chosen = next(c for c in look.cohorts if c.revision == decision.revision)
        assert chosen.idle and chosen.busy == 0 and chosen.live >= chosen.count and not chosen.held
        assert 0 <= decision.keep < chosen.count
        assert look.instances - (chosen.count - decision.keep) >= want  # never below what is needed
        assert memory.surplus_since is not None and look.at - memory.surplus_since >= config.idle_after
    else:
        assert decision.action == "hold"
        assert want <= look.instances
    if want >= look.instances:
        assert decision.action != "in" and memory.surplus_since is None


@given(cohorts(), st.integers(1, 20))
def test_choose_never_picks_a_busy_cohort(found: tuple[Cohort, ...], surplus: int) -> None:
    chosen = choose(found, surplus)
    if chosen is None:
        assert not any(c.idle and c.count for c in found)
    else:
        assert chosen.idle and chosen.count > 0
        whole = [c for c in found if c.idle and 0 < c.count <= surplus]
        assert not whole or chosen.count == max(c.count for c in whole)


def test_scale_out_from_zero_within_one_look() -> None:
    look = Look(at=10.0, demand=(QueueDemand("gpu", ready=3),), per_instance=1, cohorts=())
    decision, _ = decide(look, AutoscaleSettings(min_instances=0, max_instances=4))
    assert (decision.action, decision.add) == ("out", 3)
    assert decision.reason == ("3 task(s) wait or run (gpu 3): 3 instances at 1 task(s) each are needed and the "
                               "pool runs 0: adding a cohort of 3 instances.")
    capped, _ = decide(look, AutoscaleSettings(min_instances=0, max_instances=4, max_step=2))
    assert capped.add == 2


def test_scale_in_waits_for_idle_after_then_takes_an_idle_cohort() -> None:
    config = AutoscaleSettings(min_instances=0, max_instances=4, idle_after=60)
    pool = (Cohort("pool-a", 2, live=2, busy=1), Cohort("pool-b", 1, live=1, busy=0))
    look = Look(at=100.0, demand=(QueueDemand("q", active=1),), per_instance=1, cohorts=pool)
    first, memory = decide(look, config)
    assert first.action == "hold" and memory.surplus_since == 100.0
    assert "the surplus of 2 has lasted 0 s, one goes after 60 s" in first.reason
    later, memory = decide(Look(at=161.0, demand=look.demand, per_instance=1, cohorts=pool), config, memory)
    assert (later.action, later.revision, later.keep) == ("in", "pool-b", 0)
    busy = (Cohort("pool-a", 2, live=2, busy=1), Cohort("pool-b", 1, live=1, busy=1))
    held, _ = decide(Look(at=161.0, demand=look.demand, per_instance=1, cohorts=busy), config, memory)
    assert held.action == "hold" and "no busy instance is taken away" in held.reason


def test_a_cohort_larger_than_the_surplus_is_cut_down() -> None:
    config = AutoscaleSettings(min_instances=1, max_instances=8, idle_after=0)
    look = Look(at=5.0, demand=(), per_instance=2, cohorts=(Cohort("pool-a", 3, live=3),))
    decision, _ = decide(look, config)
    assert (decision.action, decision.revision, decision.keep) == ("in", "pool-a", 1)


def test_the_trace_keeps_news_only() -> None:
    trace = Trace(size=3)
    config = AutoscaleSettings(idle_after=60)
    for at in range(5):
        look = Look(at=float(at), demand=(), per_instance=1, cohorts=(Cohort("a", 3, live=3),))
        trace.add(look, decide(look, config, Memory(0.0))[0])
    assert len(trace.points) == 3 and len(trace.decisions) == 1
