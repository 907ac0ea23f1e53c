"""Which preflight warnings an operator accepted: all of them (``--accept-warnings``), or by check id
(``--accept-warning ID``, repeatable, and ``[preflight] accept = [...]`` in the configuration)."""

from __future__ import annotations

from collections.abc import Iterable

from celeryops.core.config import WARNING_CHECKS, accept_problem
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.ops.preflight.framework import CheckResult, PreflightReport


def check_accept_ids(ids: Iterable[str], where: str = "--accept-warning") -> tuple[str, ...]:
    """``ids`` without duplicates; a UserError (exit 2, one sentence, nothing touched) for an id that is not a
    check that can warn."""
    chosen = tuple(dict.fromkeys(ids))
    problems = [p for p in (accept_problem(i, where) for i in chosen) if p]
    if problems:
        raise UserError("; ".join(problems) + ": nothing was run; name a check whose warnings can be accepted ("
                        f"{', '.join(WARNING_CHECKS)}).", EXIT_USAGE)
    return chosen


def unaccepted_warnings(report: PreflightReport, accept_all: bool,
                        accept: Iterable[str] = ()) -> tuple[CheckResult, ...]:
    """The warnings nobody accepted (empty when ``accept_all``)."""
    if accept_all:
        return ()
    accepted = set(accept)
    return tuple(r for r in report.warnings if r.id not in accepted)


def is_accepted(result: CheckResult, accept_all: bool, accept: Iterable[str] = ()) -> bool:
    """True for a warning the operator accepted (flag or configuration)."""
    return result.status == "warn" and (accept_all or result.id in set(accept))
