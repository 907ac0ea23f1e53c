"""Worker-side slot settings: ``SlotSettings`` and ``settings_from_env`` (``CELERYOPS_SLOTS_*``).

``install`` arguments win over the environment, a contract container images rely on:
  CELERYOPS_SLOTS_<TYPE>=N             total of TYPE on this worker (CELERYOPS_SLOTS_CPU=48, CELERYOPS_SLOTS_GPU=2)
  CELERYOPS_SLOTS_LEASE_TTL            lease TTL, seconds (60)
  CELERYOPS_SLOTS_REDIS_URL            Redis holding the pools (default: the broker URL)
  CELERYOPS_SLOTS_SCOPE                global (one pool for the fleet, default) | host (a pool per worker host)
  CELERYOPS_SLOTS_HOST                 this worker's host: the per-host pool, or whose contribution to the global
                                       pool it renews (default: socket.gethostname())
  CELERYOPS_SLOTS_HOST_TTL             seconds a host's contribution to a global pool lasts without renewal
                                       (default: the lease TTL; renewed every third of the shorter of the two)
  CELERYOPS_SLOTS_FAIL                 open (run ungated when Redis is down, default) | closed (wait)
  CELERYOPS_SLOTS_ON_LOST              raise (default) | log
  CELERYOPS_SLOTS_RETRY_COUNTDOWN      seconds before a refused task is tried again (10)
  CELERYOPS_SLOTS_STARVATION_AFTER     seconds a refused request waits before it reserves its slots (60)
  CELERYOPS_SLOTS_DETECT               1 (detect CPU/GPU counts, default) | 0 (only explicit totals)
These names are reserved and cannot be resource types.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from celeryops.slots.detect import detect_totals
from celeryops.slots.store import DEFAULT_PREFIX, GLOBAL_POOL, Scope, host_pool

ENV_PREFIX = "CELERYOPS_SLOTS_"
RESERVED = frozenset({"LEASE_TTL", "REDIS_URL", "SCOPE", "HOST", "HOST_TTL", "FAIL", "ON_LOST", "RETRY_COUNTDOWN",
                      "STARVATION_AFTER", "DETECT", "HASH_TAG", "PREFIX"})


@dataclass(frozen=True)
class SlotSettings:
    redis_url: str | None = None
    lease_ttl: float = 60.0
    totals: dict[str, int] = field(default_factory=dict)
    detect: bool = True
    scope: Scope = "global"
    host: str = field(default_factory=socket.gethostname)
    fail_open: bool = True
    on_lost: Literal["raise", "log"] = "raise"
    retry_countdown: float = 10.0
    starvation_after: float = 60.0
    hash_tag: bool = True
    prefix: str = DEFAULT_PREFIX
    host_ttl: float | None = None  # a host's contribution to a global pool; None: the lease TTL

    @property
    def pool(self) -> str:
        return host_pool(self.host) if self.scope == "host" else GLOBAL_POOL

    @property
    def contribution_ttl(self) -> float:
        return self.host_ttl if self.host_ttl is not None else self.lease_ttl

    @property
    def heartbeat_interval(self) -> float:
        ttl = min(self.lease_ttl, self.contribution_ttl) if self.scope == "global" else self.lease_ttl
        return max(0.05, ttl / 3)

    def worker_totals(self) -> dict[str, int]:
        return detect_totals(self.totals) if self.detect else dict(self.totals)


def settings_from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> SlotSettings:
    """Settings from ``CELERYOPS_SLOTS_*``; keyword overrides (not None) win. ``totals`` overrides merge per type."""
    env = os.environ if env is None else env
    kw: dict[str, Any] = {}
    totals: dict[str, int] = {}
    for key, value in env.items():
        if not key.startswith(ENV_PREFIX):
            continue
        name = key[len(ENV_PREFIX):]
        if name in RESERVED or not name:
            continue
        try:
            totals[name.lower()] = int(value)
        except ValueError:
            raise ValueError(f"{key}={value!r}: a slot total must be a whole number") from None
    if "CELERYOPS_SLOTS_LEASE_TTL" in env:
        kw["lease_ttl"] = float(env["CELERYOPS_SLOTS_LEASE_TTL"])
    if env.get("CELERYOPS_SLOTS_HOST_TTL"):
        kw["host_ttl"] = float(env["CELERYOPS_SLOTS_HOST_TTL"])
    if env.get("CELERYOPS_SLOTS_REDIS_URL"):
        kw["redis_url"] = env["CELERYOPS_SLOTS_REDIS_URL"]
    if env.get("CELERYOPS_SLOTS_SCOPE"):
        kw["scope"] = _choice(env["CELERYOPS_SLOTS_SCOPE"], ("global", "host"), "CELERYOPS_SLOTS_SCOPE")
    if env.get("CELERYOPS_SLOTS_HOST"):
        kw["host"] = env["CELERYOPS_SLOTS_HOST"]
    if env.get("CELERYOPS_SLOTS_FAIL"):
        kw["fail_open"] = _choice(env["CELERYOPS_SLOTS_FAIL"], ("open", "closed"), "CELERYOPS_SLOTS_FAIL") == "open"
    if env.get("CELERYOPS_SLOTS_ON_LOST"):
        kw["on_lost"] = _choice(env["CELERYOPS_SLOTS_ON_LOST"], ("raise", "log"), "CELERYOPS_SLOTS_ON_LOST")
    if env.get("CELERYOPS_SLOTS_RETRY_COUNTDOWN"):
        kw["retry_countdown"] = float(env["CELERYOPS_SLOTS_RETRY_COUNTDOWN"])
    if env.get("CELERYOPS_SLOTS_STARVATION_AFTER"):
        kw["starvation_after"] = float(env["CELERYOPS_SLOTS_STARVATION_AFTER"])
    if env.get("CELERYOPS_SLOTS_DETECT"):
        kw["detect"] = env["CELERYOPS_SLOTS_DETECT"] not in ("0", "false", "no")
    extra_totals = overrides.pop("totals", None) or {}
    kw.update({k: v for k, v in overrides.items() if v is not None})
    totals.update({k.lower(): int(v) for k, v in extra_totals.items()})
    return SlotSettings(totals=totals, **kw)


def _choice(value: str, allowed: tuple[str, ...], name: str) -> str:
    v = value.strip().lower()
    if v not in allowed:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
    return v
