"""The public run context every strategy and flow runs in: :class:`RunContext`.

It is what a run needs whatever its strategy (or none: a flow that scales a pool is a run too): the engine
(:class:`~celeryops.ops.run.runner.Runner`: the journal, the lease, the fence, the drain), the config, the operator,
the rollouts; and the steps every run shares: the
refusals before anything changes (read-only, the operator role's permissions), the preflight and the operator's
review of it, the fleet's and the release's checks, the end of the run (:meth:`RunContext.finish`), the recovery
around a drain (:meth:`RunContext.recovering`), the fleet's verification once a release serves
(:meth:`RunContext.verify`), and the write-ahead of every side effect (:meth:`RunContext.written_ahead`: journal the
intent, act, settle).

:class:`~celeryops.ops.run.session.RunSession` is a run context with the entry points (drain, deploy, resume,
abort); the strategies (:mod:`celeryops.ops.run.strategies`) and the rollback take a run context and never import
the session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis

from celeryops.adapters.gitrepo import GitRepo
from celeryops.core.config import Config, Target
from celeryops.core.errors import EXIT_OK, EXIT_PREFLIGHT, ReadOnlyRefused
from celeryops.core.events import (
    CheckUpdate,
    Event,
    FleetBack,
    PhaseChanged,
    PreflightDone,
    RunFinished,
    RunOutcome,
    StageStarted,
    TargetDeployed,
)
from celeryops.ops.access.probe import Need, operator_needs, require
from celeryops.ops.journal import Run
from celeryops.ops.preflight import (
    Check,
    PreflightEvent,
    PreflightReport,
    is_accepted,
    run_checks,
    unaccepted_warnings,
)
from celeryops.ops.preflight.checks import (
    cloudrun_checks,
    freshness_check,
    image_check,
    permissions_check,
    release_branch_check,
)
from celeryops.ops.preflight.fleet import UNREACHABLE, fleet_checks
from celeryops.ops.run.operator import Operator
from celeryops.ops.run.rollout import Rollouts
from celeryops.ops.run.runner import Runner, uncut
from celeryops.ops.run.writeahead import written_ahead

T = TypeVar("T")


@dataclass
class RunContext:
    """What a run of any strategy runs in. ``accepted``: check ids whose warnings are accepted up front (flags,
    config); ``accept_all``: ``--accept-warnings``."""

    runner: Runner
    config: Config
    operator: Operator
    repo: Path = field(default_factory=Path.cwd)
    accepted: frozenset[str] = frozenset()
    accept_all: bool = False
    rollouts: Rollouts = field(default=None)  # type: ignore[assignment]  # made from runner and config when None

    def __post_init__(self) -> None:
        if self.rollouts is None:
            self.rollouts = Rollouts(self.runner, self.config)

    def emit(self, event: Event) -> None:
        self.runner.emit(event)

    async def written_ahead(self, run_id: str, intent: str, payload: Mapping[str, Any],
                            act: Callable[[], Awaitable[T]], **how: Any) -> T:
        """Journal the intent, act, settle (:func:`celeryops.ops.run.writeahead.written_ahead`): ``intent`` with
        ``payload`` is durable in the run's journal (and the fleet's copy) before ``act`` starts, then settled with
        how it went; ``how``: ``settle`` (the settle record from ``act``'s result), ``failed`` (the errors that
        settle it not ok, raised again)."""
        return await written_ahead(self.runner.journal, run_id, intent, payload, act, **how)

    async def journaled(self, run_id: str) -> Run:
        """Run ``run_id`` as the journal holds it now (its records so far)."""
        return await self.runner.journal.aio.get(run_id)

    def detach(self) -> None:
        """The operator detaches from the run (the console): an interruption from now on leaves its consumers stopped
        and the run open for ``celeryops resume``."""
        self.runner.detached = True

    # -- refusals before anything changes ----------------------------------------------------------------------

    def refuse_if_read_only(self, action: str) -> None:
        if self.runner.read_only:
            raise ReadOnlyRefused(action)

    async def require_operator(self, action: str) -> None:
        """Refuse ``action`` in one sentence, before anything changes, when the connected Redis user lacks a
        permission of the operator role (a watcher's user: a drain stops nothing)."""
        r = self.runner
        opts = r.fleet.app.conf.broker_transport_options or {}
        fleet_needs = operator_needs(r.fleet_name, keyprefix=str(opts.get("global_keyprefix", "")),
                                     control=str(r.fleet.app.conf.control_exchange))
        clients: list[tuple[redis.Redis, list[Need]]] = []
        if r.coord is not None:
            clients.append((r.coord, fleet_needs[:2]))
        broker = r.fleet.redis()
        if broker is not None:
            clients.append((broker, fleet_needs[2:]))
        await require(action, clients)

    # -- preflight -------------------------------------------------------------------------------------------------

    def fleet_checks(self, take_over: bool = False) -> list[Check]:
        r = self.runner
        return fleet_checks(r.fleet, r.journal, r.coord, r.fleet_name, take_over=take_over)

    def release_checks(self, release: str, sha: str, targets: tuple[Target, ...]) -> list[Check]:
        git = GitRepo(self.repo)
        rel = self.config.release
        images = [t.image_for(sha, release, release) for t in targets if t.image]
        checks = [release_branch_check(git, rel.remote, release),
                  freshness_check(git, rel.remote, release, rel.max_age_days, sha=sha or None),
                  permissions_check([(t.name, _missing(self.rollouts, t)) for t in targets]),
                  *cloudrun_checks(targets, self.rollouts.deployer, lambda t: t.image_for(sha, release, release))]
        if images:
            checks.insert(1, image_check(images))
        return checks

    async def release_sha(self, release: str) -> str:
        """The release branch's commit on the release remote ("" when it is not there: a check says so)."""
        return await GitRepo(self.repo).ls_remote(self.config.release.remote, release) or ""

    async def preflight(self, checks: list[Check]) -> PreflightReport:
        """The checks, once a step of the autoscaler that holds the fleet has ended (the pool it changes settled):
        the autoscaler starts no new step while they look (:meth:`RunnerBase.going_first`)."""
        self.emit(PhaseChanged("preflight", "checking before anything changes"))

        def on_check(event: PreflightEvent) -> None:
            result = getattr(event, "result", None)
            if result is None:
                self.emit(CheckUpdate(event.id, event.title, "running"))  # type: ignore[union-attr]
            else:
                self.emit(CheckUpdate(result.id, result.title, result.status, result.detail, result.remedy,
                                      accepted=is_accepted(result, self.accept_all, self.accepted)))

        async with self.runner.going_first():  # a step of the autoscaler ends first; it starts none meanwhile
            report = await run_checks(checks, on_check)
        if report.failed:
            await self.runner.drop_want()
        return report

    async def review(self, report: PreflightReport, *, unreachable_exit: int) -> RunFinished | None:
        """None: the operator said go. Else the run ends here, having touched nothing."""
        accepted = frozenset(w.id for w in report.warnings if is_accepted(w, self.accept_all, self.accepted))
        self.emit(PreflightDone(failed=len(report.failed), warnings=len(report.warnings),
                                accepted=tuple(sorted(accepted))))
        if report.failed:
            failed_ids = {r.id for r in report.failed}
            code = unreachable_exit if failed_ids & UNREACHABLE else EXIT_PREFLIGHT
            return self.finish("preflight_failed", code, _failure_sentence(report))
        self.emit(PhaseChanged("ready", "waiting for the operator"))
        review = await self.operator.review(report, accepted)
        unaccepted = unaccepted_warnings(report, review.accept_all, accepted | review.accepted)
        if unaccepted:
            flags = " ".join(f"--accept-warning {w.id}" for w in unaccepted)
            return self.finish("preflight_failed", EXIT_PREFLIGHT,
                               f"Preflight has warnings ({', '.join(w.title for w in unaccepted)}): nothing was "
                               f"stopped or deployed; read them, then run again with {flags} (or --accept-warnings) "
                               "to go ahead anyway.")
        if not review.proceed:
            return self.finish("declined", EXIT_OK, "Declined before stopping consumers: nothing was changed.")
        return None

    async def checked(self, checks: list[Check], *, unreachable_exit: int = EXIT_PREFLIGHT) -> RunFinished | None:
        """Preflight then the operator's review: None when the run goes on; else its end (nothing was touched).
        The rollouts are closed when the run ends here (or the preflight is interrupted)."""
        try:
            report = await self.preflight(checks)
            ended = await self.review(report, unreachable_exit=unreachable_exit)
        except BaseException:
            await self.rollouts.close()
            raise
        if ended is not None:
            await self.rollouts.close()
        return ended

    # -- the end of a run ------------------------------------------------------------------------------------------

    def finish(self, outcome: RunOutcome, code: int, message: str, **extra: Any) -> RunFinished:
        event = RunFinished(outcome=outcome, exit_code=code, message=message, **extra)
        if outcome in ("preflight_failed", "declined"):
            self.emit(PhaseChanged("failed" if outcome == "preflight_failed" else "aborted", message))
        self.emit(event)
        return event

    async def verify(self, run: Run, what: str, deployed: tuple[TargetDeployed, ...] = (),
                     outcome: RunOutcome = "deployed") -> RunFinished:
        """The release serves: wait for the fleet to answer, end the run done, lift the fence."""
        self.emit(StageStarted(stage="verify", detail="waiting for the fleet to answer"))
        workers = await self.rollouts.fleet_back()
        self.emit(FleetBack(workers=workers))
        await self.runner.advance(run.id, "done")
        await self.runner.lift_fence(run.id)
        return self.finish(outcome, EXIT_OK, f"{what}: {len(workers)} worker(s) consume again.", targets=deployed)

    async def close(self) -> None:
        """Give the lease back and close the rollouts (the end of every run that took them)."""
        await self.runner.release_lease()
        await self.rollouts.close()

    @contextlib.asynccontextmanager
    async def recovering(self, ours: Callable[[Run], bool],
                         recover: Callable[[Run], Awaitable[object]]) -> AsyncIterator[None]:
        """Around a run's drain and what follows it. Interrupted inside (also inside ``runner.drain()`` right
        after its ``drained`` record), the fleet's open run, if ``ours``, is given to ``recover`` (the strategy's
        recovery rules) before the process ends, unless the operator detached. Always: the lease is given back and
        the rollouts closed."""
        try:
            yield
        except asyncio.CancelledError:
            current = await asyncio.to_thread(self.runner.unfinished)
            if current is not None and ours(current) and not self.runner.detached:
                with contextlib.suppress(Exception):  # the interruption is what the caller must see
                    await uncut(recover(current))
            raise
        finally:
            await self.close()


def _failure_sentence(report: PreflightReport) -> str:
    """One sentence for a failed preflight: the broker's own when it cannot be reached (every other check failed
    for that reason too), the check's finding and remedy when one failed, else the failed checks' titles."""
    broker = report.get("broker")
    if broker is not None and broker.status == "fail":
        return broker.detail
    if len(report.failed) == 1:
        only = report.failed[0]
        detail = only.detail[:1].upper() + only.detail[1:]
        return f"{detail}: nothing was changed; {only.remedy or 'fix it and try again'}."
    names = ", ".join(r.title for r in report.failed)
    return (f"Preflight failed ({names}): nothing was stopped or deployed; fix what the checks say and try "
            "again.")


def _missing(rollouts: Rollouts, target: Target) -> Callable[[], Awaitable[list[str]]]:
    async def missing() -> list[str]:
        return await rollouts.deployer(target).missing_permissions(target)

    return missing


__all__ = ["RunContext"]
