"""The ``[autoscale]`` table of celeryops.toml: read and validate it into
:class:`celeryops.core.autoscale.AutoscaleSettings` (one sentence per problem, appended to ``problems`` like the
other tables of :mod:`celeryops.core.configload`).

Durations (``interval``, ``idle_after``, ``drain_timeout``) are seconds or a duration string (``"90s"``,
``"2m"``, ``"1h30m"``), as in ``[canary]``.
"""

from __future__ import annotations

from typing import Any

from celeryops.core.autoscale import AUTOSCALE_KEYS, MAX_INSTANCES_LIMIT, AutoscaleSettings
from celeryops.core.configcanary import parse_duration
from celeryops.core.configcheck import integer, names, type_name, unknown_keys

_DEFAULTS = AutoscaleSettings()
#: Integer settings and the least each may be.
_COUNTS = {"min_instances": 0, "max_instances": 1, "tasks_per_instance": 0, "max_step": 0}
#: Durations and whether 0 is allowed.
_DURATIONS = {"interval": False, "idle_after": True, "drain_timeout": False}


def validate_autoscale(table: Any, problems: list[str]) -> AutoscaleSettings:
    """The settings of an ``[autoscale]`` table (defaults for what it leaves out); each bad value adds one sentence
    to ``problems`` and keeps its default."""
    if not isinstance(table, dict):
        problems.append(f"autoscale must be a table ([autoscale]), not {type_name(table)}.")
        return _DEFAULTS
    unknown_keys(table, AUTOSCALE_KEYS, "autoscale.", problems)
    values: dict[str, Any] = {}
    for key, least in _COUNTS.items():
        if key in table:
            count = integer(table[key], f"autoscale.{key}", problems, from_text=False)
            if count is not None and count < least:
                problems.append(f"autoscale.{key} must be at least {least}, not {count}.")
            elif count is not None and key == "max_instances" and count > MAX_INSTANCES_LIMIT:
                problems.append(f"autoscale.max_instances must be at most {MAX_INSTANCES_LIMIT}, not {count}: the "
                                "counts per revision are set through an instance split in whole percents, exact "
                                f"only up to {MAX_INSTANCES_LIMIT} instances.")
            elif count is not None:
                values[key] = count
    for key, zero in _DURATIONS.items():
        if key in table:
            seconds = parse_duration(table[key])
            if seconds is None or seconds < 0 or (seconds == 0 and not zero):
                above = "0 or more" if zero else "above 0"
                problems.append(f"autoscale.{key} must be a number of seconds {above} or a duration such as \"90s\" "
                                f"or \"2m\", not {table[key]!r}.")
            else:
                values[key] = seconds
    for key in ("target", "slot_resource"):
        if key in table:
            text = table[key]
            if not isinstance(text, str) or not text.strip():
                problems.append(f"autoscale.{key} must be a non-empty string, not {type_name(text)} {text!r}.")
            else:
                values[key] = text.strip()
    if "queues" in table:
        queues = names(table["queues"], "autoscale.queues", 'queue names such as ["gpu"]', problems)
        if queues is not None:
            values["queues"] = queues
    low = values.get("min_instances", _DEFAULTS.min_instances)
    high = values.get("max_instances", _DEFAULTS.max_instances)
    if low > high:
        problems.append(f"autoscale.min_instances ({low}) is more than autoscale.max_instances ({high}): no "
                        "instance count satisfies both; lower min_instances or raise max_instances.")
        values.pop("min_instances", None)
        values.pop("max_instances", None)
    return AutoscaleSettings(**values)


__all__ = ["validate_autoscale"]
