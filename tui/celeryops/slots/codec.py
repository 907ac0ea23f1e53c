"""How slot records are written in Redis: needs (``cpu=4,gpu=1``), devices (``gpu=0,1;npu=x``), and the fields of
lease and contribution records.

Worker and host names stand between ``|`` separators in a record (a ``|`` in a name is written ``/``); a record's
task name comes last, so it may hold one. A GPU index reads back as an int, any other device id (a MIG UUID) as a str.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from celeryops.slots.snapshot import DeviceId

__all__ = ["as_text", "device_id", "device_order", "devices_text", "host_member", "needs_text", "pairs",
           "parse_devices", "parse_needs", "record_tail", "safe_field", "scores", "to_ms", "type_name"]


def record_tail(worker: str, host: str, name: str) -> str:
    """The end of a lease record: worker and host between '|' separators, the task name last (it may hold '|')."""
    return f"{safe_field(worker)}|{safe_field(host)}|{name}"


def as_text(value: Any) -> str:
    """A reply element as text, from a client with or without decode_responses."""
    return value.decode() if isinstance(value, bytes) else str(value)


def to_ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


def scores(flat: list[Any]) -> list[tuple[str, float]]:
    return [(str(flat[i]), float(flat[i + 1])) for i in range(0, len(flat), 2)]


def pairs(flat: list[Any]) -> dict[str, str]:
    return {str(flat[i]): str(flat[i + 1]) for i in range(0, len(flat), 2)}


_TYPE = re.compile(r"^[A-Za-z0-9_.:-]+$")


def type_name(typ: str) -> str:
    if not _TYPE.match(typ):
        raise ValueError(f"bad resource type {typ!r}: use letters, digits, '_', '.', ':' or '-'")
    return typ


def host_member(host: str, worker: str) -> str:
    """A contribution's member in the hosts ZSET: host and worker, '|' between them (never inside: see _field)."""
    return f"{safe_field(host)}|{safe_field(worker)}"


def safe_field(text: str) -> str:
    """Worker and host names are stored between '|' separators."""
    return text.replace("|", "/")


def needs_text(needs: Mapping[str, int], *, keep_zero: bool = False) -> str:
    """``{"gpu": 1, "cpu": 4}`` -> ``"cpu=4,gpu=1"`` (zero needs dropped unless ``keep_zero``: a host's 0 GPU is
    worth showing; negative ones and odd names refused)."""
    return _needs_text(tuple(sorted((str(k), int(v)) for k, v in needs.items())), keep_zero)


@functools.lru_cache(maxsize=1024)
def _needs_text(items: tuple[tuple[str, int], ...], keep_zero: bool = False) -> str:
    if any(v < 0 for _, v in items):
        raise ValueError(f"slot needs must not be negative: {dict(items)}")
    return ",".join(f"{type_name(k)}={v}" for k, v in items if v > 0 or keep_zero)


def parse_needs(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=", 1) for part in text.split(",") if part)}


_DEVICE = re.compile(r"^[^,;=|\s]+$")


def devices_text(devices: Mapping[str, Sequence[DeviceId]]) -> str:
    """``{"gpu": [0, 1], "npu": ["x"]}`` -> ``"gpu=0,1;npu=x"`` (types without devices dropped)."""
    parts = []
    for typ, ids in sorted(devices.items()):
        names = [str(d) for d in ids]
        bad = [n for n in names if not _DEVICE.match(n)]
        if bad:
            raise ValueError(f"bad device id {bad[0]!r} of {typ}: ',', ';', '=', '|' and spaces cannot be in one")
        if names:
            parts.append(f"{type_name(typ)}={','.join(names)}")
    return ";".join(parts)


@functools.lru_cache(maxsize=4096)
def _parse_devices(text: str) -> tuple[tuple[str, tuple[DeviceId, ...]], ...]:
    out = []
    for part in text.split(";"):
        typ, _, ids = part.partition("=")
        if typ:
            out.append((typ, tuple(device_id(d) for d in ids.split(",") if d)))
    return tuple(out)


def parse_devices(text: str) -> dict[str, list[DeviceId]]:
    """``"gpu=2,3"`` -> ``{"gpu": [2, 3]}`` (a GPU index as int, a MIG UUID as str); a new dict every call."""
    return {typ: list(ids) for typ, ids in _parse_devices(text)}


def device_id(text: str) -> DeviceId:
    return int(text) if text.isdigit() else text


def device_order(d: DeviceId) -> tuple[int, int, str]:
    return (0, d, "") if isinstance(d, int) else (1, 0, d)
