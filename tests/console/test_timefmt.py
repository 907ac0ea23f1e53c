"""The fast "running for" text is humanize's text: same strings for every runtime that matters (0 s to beyond two
years, fractional seconds included), so the task table shows exactly what it showed through humanize."""

from __future__ import annotations

import datetime as dt

import humanize
from hypothesis import given, settings
from hypothesis import strategies as st

from celeryops.console import fmt
from celeryops.console.timefmt import natural_seconds, natural_span, since

DAY = 86_400
HORIZON = 800 * DAY  # past the two years where timefmt hands over to humanize


def humanized(seconds: int) -> str:
    return str(humanize.naturaldelta(dt.timedelta(seconds=seconds)))


def test_every_second_of_the_first_two_days_and_every_day_boundary() -> None:
    for seconds in range(2 * DAY + 1):
        assert natural_seconds(seconds) == humanized(seconds), seconds
    for day in range(2, HORIZON // DAY + 1):
        for seconds in (day * DAY - 1, day * DAY, day * DAY + 1, day * DAY + DAY // 2):
            assert natural_seconds(seconds) == humanized(seconds), seconds


@settings(max_examples=3000)
@given(st.integers(min_value=0, max_value=HORIZON))
def test_whole_seconds_match_humanize(seconds: int) -> None:
    assert natural_seconds(seconds) == humanized(seconds)


@settings(max_examples=3000)
@given(st.floats(min_value=-5.0, max_value=400 * DAY, allow_nan=False))
def test_fractional_runtimes_match_the_humanize_since(runtime: float) -> None:
    """``since`` (the table's) against ``fmt.since`` (humanize of the rounded seconds, clamped at 0)."""
    assert since(runtime) == fmt.since(runtime)


def test_half_seconds_round_as_before() -> None:
    for runtime in (0.5, 1.5, 2.5, 44.5, 45.5, 89.5, 90.5, 149.5, 150.5, 5399.5, 86_399.5):
        assert since(runtime) == fmt.since(runtime), runtime
    assert since(None) == fmt.since(None) == "-"


@settings(max_examples=3000)
@given(st.integers(min_value=0, max_value=HORIZON), st.data())
def test_span_text_holds_until_its_end(seconds: int, data: st.DataObject) -> None:
    text, until = natural_span(seconds)
    assert text == humanized(seconds)
    assert until > seconds
    assert natural_seconds(until - 1) == text
    later = data.draw(st.integers(min_value=seconds, max_value=until - 1))
    assert natural_seconds(later) == text


def test_span_ends_where_the_text_changes_within_a_day() -> None:
    """Within the first day the span is exact (rows are recomputed only when their text changes), but at the end of
    the minutes (3600 s: "an hour" goes on) and of the day."""
    for seconds in range(DAY):
        text, until = natural_span(seconds)
        assert natural_seconds(until - 1) == text
        if until not in (3600, DAY):
            assert natural_seconds(until) != text, seconds
