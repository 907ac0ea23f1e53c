"""Issue 36: exact counts per revision through whole-percent instance splits, checked against a division written
out here independently (each share rounded down, the rest to the largest remainders, ties to the first listed: how
Cloud Run divides a worker pool's instances, and the stand-in with it)."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from celeryops.core.splits import counts_of, split_for


def allocate(count: int, split: tuple[tuple[str, int], ...]) -> dict[str, int]:
    """The reference division, in exact fractions."""
    merged: dict[str, int] = {}
    for revision, percent in split:
        merged[revision] = merged.get(revision, 0) + max(0, percent)
    total = sum(merged.values())
    if count <= 0 or total <= 0:
        return dict.fromkeys(merged, 0)
    shares = {rev: Fraction(count * pct, total) for rev, pct in merged.items()}
    out = {rev: int(share) for rev, share in shares.items()}
    order = list(merged)
    left = count - sum(out.values())
    for rev in sorted(order, key=lambda r: (-(shares[r] - out[r]), order.index(r)))[:left]:
        out[rev] += 1
    return out


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
@example(50, [25, 25, 100])  # remainders tie at a third each: the first listed gets the instance (floats broke it)
@settings(max_examples=500, deadline=None)
def test_counts_of_is_the_division(count: int, percents: list[int]) -> None:
    split = tuple((f"r{i % 4}", p) for i, p in enumerate(percents))
    assert counts_of(count, split) == allocate(count, split)


@pytest.mark.parametrize("counts", [{}, {"a": 0}, {"a": 60, "b": 41}])
def test_split_for_refuses_what_it_cannot_give(counts: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="1 to 100 instances"):
        split_for(counts)
