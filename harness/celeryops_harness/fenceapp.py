"""The test Celery app with the drain fence plugin installed (the tasks are those of ``celeryops_harness.taskapp``).

Configured by the environment, on top of taskapp's variables:
  CELERYOPS_FENCE_REDIS_URL      where the fence lives (default: the broker, when it is Redis)
  CELERYOPS_FENCE_INTERVAL       seconds between fence checks / registry heartbeats (default 2.0)
  CELERYOPS_FENCE_REGISTRY_TTL   seconds a silent plugin worker stays listed (default: the plugin's)
  CELERYOPS_VERSION, and what Cloud Run sets (CLOUD_RUN_WORKER_POOL_REVISION or K_REVISION): this worker's identity
                                 for exemptions;  CELERYOPS_FLEET  the fleet
"""

from __future__ import annotations

import os

from celeryops.fence import install
from celeryops_harness.taskapp import app, noop, sleep, work

install(
    app,
    interval=float(os.environ.get("CELERYOPS_FENCE_INTERVAL") or 2.0),
    registry_ttl=float(os.environ["CELERYOPS_FENCE_REGISTRY_TTL"]) if os.environ.get("CELERYOPS_FENCE_REGISTRY_TTL")
    else None,
)

__all__ = ["app", "noop", "sleep", "work"]
