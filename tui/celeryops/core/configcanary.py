"""The ``[canary]`` table of celeryops.toml: read and validate it into :class:`celeryops.core.canary.CanarySettings`
(one sentence per problem, appended to ``problems`` like the other tables of :mod:`celeryops.core.configload`).

Durations (``max_duration``, ``look_interval``) are seconds (``600``, ``90.5``) or a duration string: numbers with
a unit ``h``, ``m`` or ``s``, one or more (``"10m"``, ``"1h30m"``, ``"45s"``, ``"1.5h"``).
"""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any

from celeryops.core.canary import CANARY_KEYS, CanarySettings
from celeryops.core.configcheck import integer, names, type_name, unknown_keys

_UNIT = {"h": 3600.0, "m": 60.0, "s": 1.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)([hms])")
_DEFAULTS = CanarySettings()


def parse_duration(value: Any) -> float | None:
    """Seconds from a number (not a boolean) or a duration string (``"10m"``, ``"1h30m"``, ``"90s"``, ``"90"``);
    None when it is neither. The result may be 0 or negative only for a negative number given as such."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if math.isfinite(value) else None
    if not isinstance(value, str):
        return None
    text = value.strip().lower().replace(" ", "")
    if not text:
        return None
    try:
        return float(text) if math.isfinite(float(text)) else None
    except ValueError:
        pass
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            return None
        total += float(match.group(1)) * _UNIT[match.group(2)]
        pos = match.end()
    return total if pos == len(text) else None


def _fraction(value: Any, where: str, problems: list[str], low: float, high: float, *, closed_low: bool,
              meaning: str) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        problems.append(f"{where} must be a number ({meaning}), not {type_name(value)} {value!r}.")
        return None
    number = float(value)
    inside = (low <= number if closed_low else low < number) and number < high
    if not inside:
        bracket = "[" if closed_low else "("
        problems.append(f"{where} must be in {bracket}{low:g}, {high:g}) ({meaning}), not {value!r}.")
        return None
    return number


def validate_canary(table: Any, problems: list[str]) -> CanarySettings:
    """The settings of a ``[canary]`` table (defaults for what it leaves out); each bad value adds one sentence to
    ``problems`` and keeps its default."""
    if not isinstance(table, dict):
        problems.append(f"canary must be a table ([canary]), not {type_name(table)}.")
        return _DEFAULTS
    unknown_keys(table, CANARY_KEYS, "canary.", problems)
    values: dict[str, Any] = {}
    for key in ("min_tasks", "instances", "new_exception_count", "crash_limit"):
        if key in table:
            count = integer(table[key], f"canary.{key}", problems, from_text=False)
            if count is not None and count < 1:
                problems.append(f"canary.{key} must be at least 1, not {count}.")
            elif count is not None:
                values[key] = count
    for key in ("max_duration", "look_interval"):
        if key in table:
            seconds = parse_duration(table[key])
            if seconds is None or seconds <= 0:
                problems.append(f"canary.{key} must be a number of seconds above 0 or a duration such as \"10m\" "
                                f"or \"1h30m\", not {table[key]!r}.")
            else:
                values[key] = seconds
    ranges = {"margin": (0.0, 1.0, False, "the tolerated increase of the failure rate, a fraction: 0.05 is 5 %"),
              "min_effect": (0.0, 1.0, True, "the smallest increase of the failure rate that rolls back: 0.02 is "
                                             "2 %"),
              "alpha": (0.0, 0.5, False, "the chance of rolling back a release as good as the old one: 0.01 is 1 %"),
              "confidence": (0.5, 1.0, False, "of the promotion bound: 0.95 is 95 %")}
    for key, (low, high, closed, meaning) in ranges.items():
        if key in table:
            number = _fraction(table[key], f"canary.{key}", problems, low, high, closed_low=closed, meaning=meaning)
            if number is not None:
                values[key] = number
    if "ignore_exceptions" in table:
        ignored = names(table["ignore_exceptions"], "canary.ignore_exceptions",
                        'exception type names such as ["SoftTimeLimitExceeded"]', problems)
        if ignored is not None:
            values["ignore_exceptions"] = ignored
    look = values.get("look_interval", _DEFAULTS.look_interval)
    longest = values.get("max_duration", _DEFAULTS.max_duration)
    if look > longest and ("look_interval" in values or "max_duration" in values):
        problems.append(f"canary.look_interval ({look:g} s) is longer than canary.max_duration ({longest:g} s): "
                        "the canary would end before its first look; shorten the interval.")
        values.pop("look_interval", None)
        values.pop("max_duration", None)
    known = {f.name for f in fields(CanarySettings)}
    return CanarySettings(**{k: v for k, v in values.items() if k in known})


__all__ = ["parse_duration", "validate_canary"]
