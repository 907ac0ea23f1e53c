"""``running for`` text, fast: the text of :func:`celeryops.console.fmt.since` (``humanize.naturaldelta`` of the
rounded seconds, English) without humanize's per-call cost (timedelta, gettext lookups: ~3 us a call, 30 ms for a
10,000-row task table). ``tests/console/test_timefmt.py`` proves the texts equal humanize's from 0 s to beyond two
years, fractional seconds included. From two years on, humanize itself answers (rare, and it adds thousands
separators)."""

from __future__ import annotations

import datetime as dt
from functools import lru_cache

import humanize

_DAY = 86_400
_TWO_YEARS = 730 * _DAY


def natural_seconds(seconds: int) -> str:
    """``humanize.naturaldelta(timedelta(seconds=seconds))`` for whole ``seconds`` >= 0, its branches in its order
    (``round`` is Python's: halves go to the even number, as in humanize)."""
    if seconds >= _TWO_YEARS:
        return str(humanize.naturaldelta(dt.timedelta(seconds=seconds)))
    days, secs = divmod(seconds, _DAY)
    if days == 0:
        if secs == 0:
            return "a moment"
        if secs == 1:
            return "a second"
        if secs < 60:
            return f"{secs} seconds"
        if secs < 3600:
            minutes = round(secs / 60)
            if minutes == 1:
                return "a minute"
            return "an hour" if minutes == 60 else f"{minutes} minutes"
        hours = round(secs / 3600)
        if hours == 1:
            return "an hour"
        return "a day" if hours == 24 else f"{hours} hours"
    years, days = divmod(days, 365)
    months = round(days / 30.5)
    if years == 0:
        if days == 1:
            return "a day"
        if months == 0:
            return f"{days} days"
        if months == 1:
            return "a month"
        return "a year" if months == 12 else f"{months} months"
    # one year and some
    if months == 0:
        if days == 0:
            return "a year"
        return "1 year, 1 day" if days == 1 else f"1 year, {days} days"
    if months == 1:
        return "1 year, 1 month"
    return "2 years" if months == 12 else f"1 year, {months} months"


def since(seconds: float | None) -> str:
    """Same text as :func:`celeryops.console.fmt.since`: ``-`` for None, else the rounded seconds (at least 0)."""
    if seconds is None:
        return "-"
    return natural_seconds(max(0, round(seconds)))


@lru_cache(maxsize=1 << 14)
def natural_span(seconds: int) -> tuple[str, int]:
    """``(natural_seconds(seconds), until)``: the text, and the first whole second after ``seconds`` at which it may
    change (it is the same for every whole second in ``[seconds, until)``). A table keeps ``until`` per row and
    recomputes a row's text only once its runtime reaches it. Cached: thousands of tasks share their seconds."""
    days, secs = divmod(seconds, _DAY)
    if days:  # from one day on the text depends only on the number of days
        return natural_seconds(seconds), (days + 1) * _DAY
    if secs < 60:
        until = secs + 1
    elif secs < 3600:  # round(s / 60) keeps its value m up to s / 60 = m + 0.5 (included when m is even)
        minutes = round(secs / 60)
        until = min(60 * minutes + 30 + (minutes % 2 == 0), 3600)
    else:
        hours = round(secs / 3600)
        until = min(3600 * hours + 1800 + (hours % 2 == 0), _DAY)
    return natural_seconds(seconds), until
