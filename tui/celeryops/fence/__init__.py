"""Drain fence: keeps Celery workers from fetching while a drain runs, and lets them resume by themselves if the
operator's run dies (the fence is a Redis key with a TTL that the run's heartbeat renews).

Operator side: ``FenceStore`` (raise / renew / rescope / lift / read), ``plugin_workers`` (registry of plugin
workers, a membership source for the drain), ``fence_status`` (which workers run the plugin, over remote control).
Worker side: ``install(app)`` adds the consumer bootstep. Imports only celery, kombu, redis and the standard library.
"""

from __future__ import annotations

from celeryops.fence import registry
from celeryops.fence.control import COMMAND, FenceReply, fence_status
from celeryops.fence.plugin import FenceConfig, FenceGuard, FenceStep, install
from celeryops.fence.record import ALL_QUEUES, FenceRecord, Hold
from celeryops.fence.registry import PluginWorkerInfo, heartbeat_states, plugin_workers, registry_key
from celeryops.fence.store import FenceConflict, FenceStore

__all__ = [
    "ALL_QUEUES", "COMMAND", "FenceConfig", "FenceConflict", "FenceGuard", "FenceRecord", "FenceReply",
    "FenceStep", "FenceStore", "Hold", "PluginWorkerInfo", "fence_status", "heartbeat_states", "install",
    "plugin_workers",
    "registry", "registry_key",
]
