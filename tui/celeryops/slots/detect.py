"""Slot totals of this worker host: CPU count, GPU count (NVML when nvidia-ml-py is installed, else 0),
overridden by explicit totals or ``CELERYOPS_SLOTS_<TYPE>=N`` environment variables."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

log = logging.getLogger(__name__)


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask in a container), else os.cpu_count()."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def gpu_count() -> int:
    """GPUs NVML sees; 0 without nvidia-ml-py or without a driver."""
    try:
        import pynvml
    except ImportError:
        return 0
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError when no driver/library: a host without GPUs
        return 0
    try:
        return int(pynvml.nvmlDeviceGetCount())
    except Exception:
        log.warning("NVML initialised but could not count GPUs; using 0 GPU slots")
        return 0
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def detect_totals(overrides: Mapping[str, int] | None = None) -> dict[str, int]:
    """``{"cpu": n, "gpu": m}`` detected, then ``overrides`` (which may add types such as ``licence``)."""
    totals = {"cpu": cpu_count(), "gpu": gpu_count()}
    totals.update({k.lower(): int(v) for k, v in (overrides or {}).items()})
    return totals
