"""The preflight check framework: typed results and events, and a runner that runs independent checks at once.

A ``Check`` is an id, a title and an async callable returning a ``CheckResult``. ``run_checks`` starts all checks
together (``asyncio.gather``), gives each its own timeout, and turns a check that raises or times out into a
``fail`` whose detail is one sentence (never a traceback). It reports progress as ``CheckStarted`` /
``CheckFinished`` events, so a console can show a spinner per check, and returns a ``PreflightReport`` with the
results in the declared order. Nothing here does I/O or knows about Textual.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

import humanize

from celeryops.core.masking import mask_text

CheckStatus = Literal["ok", "warn", "fail"]
DEFAULT_TIMEOUT = 30.0


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict. ``detail`` is one line saying what was found; ``remedy`` says what to do (may be empty
    when the status is ``ok``)."""

    id: str
    title: str
    status: CheckStatus
    detail: str
    remedy: str = ""
    # Results of their own that this check found (``celeryops doctor``'s findings: one warning per finding id), each
    # reported and accepted by its own id after the check's own result, and listed after it in the report.
    parts: tuple[CheckResult, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Check:
    """A check to run: ``run`` is awaited with no arguments. ``timeout`` (seconds) overrides the runner's default."""

    id: str
    title: str
    run: Callable[[], Awaitable[CheckResult]]
    timeout: float | None = None


@dataclass(frozen=True)
class CheckStarted:
    id: str
    title: str


@dataclass(frozen=True)
class CheckFinished:
    result: CheckResult


PreflightEvent = CheckStarted | CheckFinished
EventHandler = Callable[[PreflightEvent], object]  # may return an awaitable, which is awaited


@dataclass(frozen=True)
class PreflightReport:
    """All results, in the order the checks were declared."""

    results: tuple[CheckResult, ...]

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.status == "fail")

    @property
    def warnings(self) -> tuple[CheckResult, ...]:
        return tuple(r for r in self.results if r.status == "warn")

    def ok_to_proceed(self, accept_warnings: bool, accept: Iterable[str] = ()) -> bool:
        """No failure, and every warning accepted: all of them (``accept_warnings``) or by id (``accept``)."""
        accepted = set(accept)
        return not self.failed and (accept_warnings or all(r.id in accepted for r in self.warnings))

    def get(self, check_id: str) -> CheckResult | None:
        return next((r for r in self.results if r.id == check_id), None)


def one_line(text: str) -> str:
    """Collapse whitespace (newlines included) and mask passwords in URLs: details are shown on one line."""
    return mask_text(" ".join(text.split()))


def refusal(text: str) -> tuple[str, str]:
    """A refusal's sentence (``X: nothing was changed; do Y.``) as a failed check's finding ``X`` and remedy ``do
    Y`` (the preflight's verdict says that nothing was changed itself, once); a sentence without its own remedy:
    itself, and "fix what the message says"."""
    said, _, todo = one_line(text).partition(": nothing was changed; ")
    if todo:
        return said, todo.rstrip(".")
    return said.rstrip("."), "fix what the message says, then run preflight again"


def _failure_from_exception(check: Check, exc: BaseException) -> CheckResult:
    detail = getattr(exc, "detail", None)
    remedy = getattr(exc, "remedy", None)
    if not isinstance(detail, str) or not detail:
        message = one_line(str(exc))
        detail = f"{check.title} could not be checked: {message or type(exc).__name__}"
    if not isinstance(remedy, str) or not remedy:
        remedy = "fix the cause above and run preflight again"
    return CheckResult(check.id, check.title, "fail", one_line(detail), one_line(remedy))


async def _emit(on_event: EventHandler | None, event: PreflightEvent) -> None:
    if on_event is None:
        return
    outcome = on_event(event)
    if inspect.isawaitable(outcome):
        await outcome


async def run_check(
    check: Check, timeout: float = DEFAULT_TIMEOUT, on_event: EventHandler | None = None
) -> CheckResult:
    """Run one check with its timeout; never raises (except cancellation of the caller)."""
    limit = check.timeout if check.timeout is not None else timeout
    await _emit(on_event, CheckStarted(check.id, check.title))
    try:
        result = await asyncio.wait_for(check.run(), limit)
    except TimeoutError:
        result = CheckResult(
            check.id, check.title, "fail",
            f"{check.title} did not finish within {humanize.precisedelta(limit, minimum_unit='milliseconds')}",
            "check that the service it talks to is reachable, then run preflight again",
        )
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        result = _failure_from_exception(check, exc)
    else:
        if not isinstance(result, CheckResult):
            result = CheckResult(check.id, check.title, "fail", f"{check.title} returned no result",
                                 "report this as a bug in the check")
        result = replace(result, id=check.id, title=check.title, detail=one_line(result.detail),
                         remedy=one_line(result.remedy),
                         parts=tuple(replace(p, detail=one_line(p.detail), remedy=one_line(p.remedy), parts=())
                                     for p in result.parts))
    await _emit(on_event, CheckFinished(result))
    for part in result.parts:
        await _emit(on_event, CheckFinished(part))
    return result


async def run_checks(
    checks: Sequence[Check], on_event: EventHandler | None = None, *, timeout: float = DEFAULT_TIMEOUT
) -> PreflightReport:
    """Run all ``checks`` concurrently; each gets ``timeout`` seconds unless it sets its own."""
    ids = [c.id for c in checks]
    if len(set(ids)) != len(ids):
        raise ValueError(f"check ids must be unique: {ids}")
    results = await asyncio.gather(*(run_check(c, timeout, on_event) for c in checks))
    return PreflightReport(tuple(r for result in results for r in (result, *result.parts)))
