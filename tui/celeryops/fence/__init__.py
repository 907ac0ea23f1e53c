"""Drain fence: keeps Celery workers from fetching while a drain runs, and lets them resume by themselves if the
operator's run dies (the fence is a Redis key with a TTL that the run's heartbeat renews).

Operator side: ``FenceStore`` (raise / renew / rescope / lift / read), ``plugin_workers`` (registry of plugin
workers, a membership source for the drain), ``fence_status`` (which workers run the plugin, over remote control).
Worker side: ``install(app)`` adds the consumer bootstep. Imports only celery, kombu, redis and the standard library,
each submodule when one of its names is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celeryops.fence import registry
    from celeryops.fence.control import COMMAND, FenceReply, fence_status
    from celeryops.fence.plugin import FenceConfig, FenceGuard, FenceStep, install
    from celeryops.fence.record import ALL_QUEUES, CloudRunIdentity, FenceRecord, Hold, cloud_run_identity, platform_of
    from celeryops.fence.registry import (
        PluginWorkerInfo,
        by_revision,
        heartbeat_states,
        instances_by_revision,
        listed_workers,
        plugin_workers,
        registry_key,
    )
    from celeryops.fence.selfreport import WorkerReport
    from celeryops.fence.store import FenceConflict, FenceStore

# name -> the submodule that defines it: imported on first use, so an operator process that needs the store or the
# registry does not load the worker plugin (Celery's bootsteps) and a worker loads only what it installs.
_LAZY = {
    "ALL_QUEUES": "record", "CloudRunIdentity": "record", "cloud_run_identity": "record", "by_revision": "registry",
    "COMMAND": "control", "FenceConfig": "plugin", "FenceConflict": "store",
    "FenceGuard": "plugin", "FenceRecord": "record", "FenceReply": "control", "FenceStep": "plugin",
    "FenceStore": "store", "Hold": "record", "PluginWorkerInfo": "registry", "fence_status": "control",
    "install": "plugin", "plugin_workers": "registry", "registry_key": "registry", "heartbeat_states": "registry",
    "listed_workers": "registry", "instances_by_revision": "registry", "platform_of": "record",
    "WorkerReport": "selfreport",
}

__all__ = [
    "ALL_QUEUES",
    "COMMAND",
    "CloudRunIdentity",
    "FenceConfig",
    "FenceConflict",
    "FenceGuard",
    "FenceRecord",
    "FenceReply",
    "FenceStep",
    "FenceStore",
    "Hold",
    "PluginWorkerInfo",
    "WorkerReport",
    "by_revision",
    "cloud_run_identity",
    "fence_status",
    "heartbeat_states",
    "install",
    "instances_by_revision",
    "listed_workers",
    "platform_of",
    "plugin_workers",
    "registry",
    "registry_key",
]


def __getattr__(name: str) -> Any:
    if name == "registry":
        return importlib.import_module("celeryops.fence.registry")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'celeryops.fence' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"celeryops.fence.{module}"), name)
    globals()[name] = value
    return value
