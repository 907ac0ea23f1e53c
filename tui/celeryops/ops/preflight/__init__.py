"""Preflight: checks that run before a deploy touches anything (framework + the git/registry/IAM checks)."""

from celeryops.ops.preflight.checks import freshness_check, image_check, permissions_check, release_branch_check
from celeryops.ops.preflight.framework import (
    Check,
    CheckFinished,
    CheckResult,
    CheckStarted,
    CheckStatus,
    EventHandler,
    PreflightEvent,
    PreflightReport,
    run_check,
    run_checks,
)

__all__ = [
    "Check",
    "CheckFinished",
    "CheckResult",
    "CheckStarted",
    "CheckStatus",
    "EventHandler",
    "PreflightEvent",
    "PreflightReport",
    "freshness_check",
    "image_check",
    "permissions_check",
    "release_branch_check",
    "run_check",
    "run_checks",
]
