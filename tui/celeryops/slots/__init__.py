"""Resource slots: Redis-Lua slot leases that gate CPU/GPU-heavy Celery tasks and never leak.

Worker-side: imports only celery and redis (no Textual, no Google). Public API:
``SlotStore`` (acquire/renew/adopt/release/reap/set_totals/contribute/withdraw/snapshot), ``read_all`` (every pool,
for the console), ``SlotTask`` / ``slot_task`` / ``install`` (Celery; ``SlotTask.slot_devices``), ``detect`` /
``detect_totals`` / ``cpu_count`` / ``gpu_devices`` (what a host has), and the snapshot dataclasses.
"""

from __future__ import annotations

from celeryops.slots.celery import (
    LeaseLost,
    SlotRuntime,
    SlotsBusy,
    SlotSettings,
    SlotTask,
    install,
    runtime,
    settings_from_env,
    slot_task,
)
from celeryops.slots.detect import Detected, DeviceId, cpu_count, detect, detect_totals, gpu_count, gpu_devices
from celeryops.slots.snapshot import (
    DeviceUsage,
    Holder,
    HostContribution,
    PoolSnapshot,
    Snapshot,
    TypeUsage,
    Waiting,
)
from celeryops.slots.store import (
    DEFAULT_PREFIX,
    GLOBAL_POOL,
    AcquireResult,
    ContributeResult,
    RenewResult,
    SlotStore,
    connect,
    host_pool,
    read_all,
    read_legacy,
)

__all__ = [
    "DEFAULT_PREFIX", "GLOBAL_POOL", "AcquireResult", "ContributeResult", "Detected", "DeviceId", "DeviceUsage",
    "Holder", "HostContribution", "LeaseLost", "PoolSnapshot", "RenewResult", "SlotRuntime", "SlotSettings",
    "SlotStore", "SlotTask", "SlotsBusy", "Snapshot", "TypeUsage", "Waiting", "connect", "cpu_count", "detect",
    "detect_totals", "gpu_count", "gpu_devices", "host_pool", "install", "read_all", "read_legacy", "runtime",
    "settings_from_env", "slot_task",
]
