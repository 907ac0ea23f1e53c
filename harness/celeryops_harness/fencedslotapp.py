"""The slot-gated test app (``slotapp``) with the drain fence plugin installed too: a worker that is both fenced and
slot-gated, as the worker role of ``celeryops acl`` runs it (configured by the environment like both)."""

from __future__ import annotations

import os

from celeryops.fence import install
from celeryops_harness.slotapp import app, slot_sleep

install(app, interval=float(os.environ.get("CELERYOPS_FENCE_INTERVAL") or 2.0))

__all__ = ["app", "slot_sleep"]
