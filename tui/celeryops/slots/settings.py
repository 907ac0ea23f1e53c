"""Worker-side slot settings: ``SlotSettings`` and ``settings_from_env`` (``CELERYOPS_SLOTS_*``).

``install`` arguments win over the environment, a contract container images rely on:
  CELERYOPS_SLOTS_<TYPE>=N             total of TYPE on this worker (CELERYOPS_SLOTS_CPU=48, CELERYOPS_SLOTS_GPU=2:
                                       GPU devices 0 and 1)
  CELERYOPS_SLOTS_LEASE_TTL            lease TTL, seconds (60)
  CELERYOPS_SLOTS_REDIS_URL            Redis holding the pools (default: the broker URL)
  CELERYOPS_SLOTS_SCOPE                host (default: every type is a resource of the machine, in a pool per host,
                                       GPU slots bound to devices; the types in CELERYOPS_SLOTS_SHARED are in the
                                       global pool) | global (every type in one pool for the fleet, no device
                                       binding: the default before per-host pools)
  CELERYOPS_SLOTS_SHARED               types that are shared by the fleet, not a machine's ("licence,api"): their
                                       pool is the global one, whose total is the sum of the hosts' contributions
  CELERYOPS_SLOTS_HOST                 this worker's host: its pool, and whose contribution to the global pool it
                                       renews (default: on Cloud Run the instance, <revision>.<8 hex of its
                                       instance id>, as the renamed node name says; elsewhere socket.gethostname();
                                       in containers, the machine's name, so
                                       that the containers of one machine share its pool)
  CELERYOPS_SLOTS_HOST_TTL             seconds a worker's contribution to a pool lasts without renewal (default:
                                       the lease TTL; renewed every third of the shorter of the two)
  CELERYOPS_SLOTS_FAIL                 open (run ungated when Redis is down, default) | closed (wait)
  CELERYOPS_SLOTS_ON_LOST              raise (default) | log
  CELERYOPS_SLOTS_RETRY_COUNTDOWN      seconds before a refused task is tried again (10): with the handoff, only
                                       the fallback when a wake-up was lost
  CELERYOPS_SLOTS_HANDOFF              1 (default: freed slots start the oldest waiting task that fits at once) | 0
                                       (a refused task waits for its retry only: the behaviour before the handoff)
  CELERYOPS_SLOTS_STARVATION_AFTER     seconds a refused request waits before it reserves its slots (60)
  CELERYOPS_SLOTS_DETECT               1 (detect CPU/GPU counts, default) | 0 (only explicit totals)
These names are reserved and cannot be resource types.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from celeryops.core.instance import instance_host, instance_id, on_cloud_run
from celeryops.slots.detect import Detected, detect
from celeryops.slots.store import DEFAULT_PREFIX, GLOBAL_POOL, Scope, host_pool, type_name

ENV_PREFIX = "CELERYOPS_SLOTS_"
RESERVED = frozenset({"LEASE_TTL", "REDIS_URL", "SCOPE", "SHARED", "HOST", "HOST_TTL", "FAIL", "ON_LOST",
                      "RETRY_COUNTDOWN", "STARVATION_AFTER", "DETECT", "HASH_TAG", "PREFIX", "HANDOFF"})


@dataclass(frozen=True)
class SlotSettings:
    redis_url: str | None = None
    lease_ttl: float = 60.0
    totals: dict[str, int] = field(default_factory=dict)
    detect: bool = True
    scope: Scope = "host"
    shared: frozenset[str] = frozenset()
    host: str = field(default_factory=socket.gethostname)
    fail_open: bool = True
    on_lost: Literal["raise", "log"] = "raise"
    retry_countdown: float = 10.0
    starvation_after: float = 60.0
    hash_tag: bool = True
    prefix: str = DEFAULT_PREFIX
    host_ttl: float | None = None  # a host's contribution to a global pool; None: the lease TTL
    handoff: bool = True  # freed slots start waiting tasks at once (work-conserving), the retry is the fallback

    @property
    def pool(self) -> str:
        """This worker's own pool: its host's (the global pool with ``scope="global"``)."""
        return host_pool(self.host) if self.scope == "host" else GLOBAL_POOL

    def pool_of(self, typ: str) -> str:
        """The pool of a resource type: the global pool for a shared type (or every type with
        ``scope="global"``), else this worker's host's."""
        return GLOBAL_POOL if self.scope == "global" or typ in self.shared else host_pool(self.host)

    def split(self, needs: Mapping[str, int]) -> list[tuple[str, dict[str, int]]]:
        """``needs`` per pool, this host's pool first: ``[("host:h1", {"gpu": 1}), ("global", {"licence": 1})]``."""
        parts: dict[str, dict[str, int]] = {}
        for typ, n in needs.items():
            parts.setdefault(self.pool_of(typ), {})[typ] = n
        return sorted(parts.items(), key=lambda kv: kv[0] == GLOBAL_POOL)

    @property
    def contribution_ttl(self) -> float:
        return self.host_ttl if self.host_ttl is not None else self.lease_ttl

    @property
    def heartbeat_interval(self) -> float:
        return max(0.05, min(self.lease_ttl, self.contribution_ttl) / 3)

    def detected(self) -> Detected:
        """This host's totals and devices: detected (``detect``) and the explicit totals, which win."""
        return detect(self.totals, probe=self.detect)

    def worker_totals(self) -> dict[str, int]:
        return self.detected().totals


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
    if env.get("CELERYOPS_SLOTS_SHARED", "").strip():
        kw["shared"] = shared_types(env["CELERYOPS_SLOTS_SHARED"], "CELERYOPS_SLOTS_SHARED")
    if env.get("CELERYOPS_SLOTS_HOST"):
        kw["host"] = env["CELERYOPS_SLOTS_HOST"]
    elif on_cloud_run(env):  # every instance's hostname is localhost there: the instance is the machine
        ident = instance_id() if env is os.environ else instance_id(dict(env))
        kw["host"] = instance_host(env, ident)
    if env.get("CELERYOPS_SLOTS_FAIL"):
        kw["fail_open"] = _choice(env["CELERYOPS_SLOTS_FAIL"], ("open", "closed"), "CELERYOPS_SLOTS_FAIL") == "open"
    if env.get("CELERYOPS_SLOTS_ON_LOST"):
        kw["on_lost"] = _choice(env["CELERYOPS_SLOTS_ON_LOST"], ("raise", "log"), "CELERYOPS_SLOTS_ON_LOST")
    if env.get("CELERYOPS_SLOTS_RETRY_COUNTDOWN"):
        kw["retry_countdown"] = float(env["CELERYOPS_SLOTS_RETRY_COUNTDOWN"])
    if env.get("CELERYOPS_SLOTS_STARVATION_AFTER"):
        kw["starvation_after"] = float(env["CELERYOPS_SLOTS_STARVATION_AFTER"])
    if env.get("CELERYOPS_SLOTS_HANDOFF"):
        kw["handoff"] = env["CELERYOPS_SLOTS_HANDOFF"] not in ("0", "false", "no")
    if env.get("CELERYOPS_SLOTS_DETECT"):
        kw["detect"] = env["CELERYOPS_SLOTS_DETECT"] not in ("0", "false", "no")
    extra_totals = overrides.pop("totals", None) or {}
    if overrides.get("shared") is not None:
        overrides["shared"] = shared_types(overrides["shared"], "shared")
    kw.update({k: v for k, v in overrides.items() if v is not None})
    totals.update({k.lower(): int(v) for k, v in extra_totals.items()})
    return SlotSettings(totals=totals, **kw)


def shared_types(value: str | Iterable[str], name: str) -> frozenset[str]:
    """``"licence, api"`` (or a list) -> ``{"licence", "api"}``; a name that cannot be a type is refused."""
    items = value.split(",") if isinstance(value, str) else list(value)
    out = set()
    for item in (str(i).strip().lower() for i in items):
        if item:
            try:
                out.add(type_name(item))
            except ValueError as exc:
                raise ValueError(f"{name}: {exc}") from None
    return frozenset(out)


def _choice(value: str, allowed: tuple[str, ...], name: str) -> str:
    v = value.strip().lower()
    if v not in allowed:
        raise ValueError(f"{name}={value!r}: expected one of {', '.join(allowed)}")
    return v
