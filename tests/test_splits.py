"""Issue 36: exact counts per revision through whole-percent instance splits, checked against the Cloud Run
stand-in's own division (each share rounded down, the rest to the largest remainders, ties to the first listed)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from celeryops.core.splits import counts_of, split_for
from celeryops.demo.standins.cloudrun_instances import allocate


@given(st.lists(st.integers(0, 100), min_size=1, max_size=12).filter(lambda c: 0 < sum(c) <= 100))
@settings(max_examples=600, deadline=None)
def test_split_for_gives_exactly_the_counts(counts: list[int]) -> None:
    wanted = {f"pool-{i:05d}-x": n for i, n in enumerate(counts)}
    split = split_for(wanted)
    assert sum(p for _, p in split) == 100 and all(p > 0 for _, p in split)
    total = sum(counts)
    expect = {rev: n for rev, n in wanted.items() if n}
    assert allocate(total, split) == expect
    assert counts_of(total, split) == expect


@given(st.integers(0, 200), st.lists(st.integers(0, 100), min_size=1, max_size=6))
def test_counts_of_is_the_standins_division(count: int, percents: list[int]) -> None:
    split = tuple((f"r{i % 4}", p) for i, p in enumerate(percents))
    assert counts_of(count, split) == allocate(count, split)


@pytest.mark.parametrize("counts", [{}, {"a": 0}, {"a": 60, "b": 41}])
def test_split_for_refuses_what_it_cannot_give(counts: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="1 to 100 instances"):
        split_for(counts)
