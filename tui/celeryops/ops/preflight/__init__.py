"""Preflight: checks that run before a deploy touches anything (framework + the git/registry/IAM checks)."""

from celeryops.ops.preflight.accept import check_accept_ids, is_accepted, unaccepted_warnings
from celeryops.ops.preflight.checks import (
    cloudrun_checks,
    freshness_check,
    image_check,
    permissions_check,
    release_branch_check,
    traffic_check,
    validate_check,
)
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
    "check_accept_ids",
    "cloudrun_checks",
    "freshness_check",
    "image_check",
    "is_accepted",
    "permissions_check",
    "release_branch_check",
    "run_check",
    "run_checks",
    "traffic_check",
    "unaccepted_warnings",
    "validate_check",
]
