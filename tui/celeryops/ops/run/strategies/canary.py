"""``strategy = "canary"``: a few instances of the new release beside the old ones, their task outcomes compared with
the old ones', then promoted or rolled back by the analysis. Cloud Run worker pools only.

The flow (each pool update and each verdict written ahead in the journal; the pool mechanics of
:mod:`celeryops.ops.run.pool`):

1. preflight: the overlap's checks, with the canary's peak (``count + [canary] instances``) and its update
   validated;
2. ``overlapping``: one update runs ``instances`` of the new revision beside every old instance, with a split that
   gives exactly those counts (:func:`~celeryops.core.canary.canary_split`); wait until the canary consumes;
3. the analysis: Celery task events (turned on for the canary's length where they were off, and back after) credit
   every outcome to the revision of the worker that ran it (the fence registry knows it); every ``look_interval``
   the judge (:func:`~celeryops.ops.run.analysis.rules.judge`, pure) looks at the counts, a ``canary_look`` event
   carries them with its statistic and verdict, and the counts are journaled (a resume goes on from them);
4. **promote** (the verdict, or the operator): written ahead, then the overlap's way: one update to as many new
   instances as old ones (``promoting``), the old revision drained by the drain's rules (no busy instance is taken
   away), then every instance on the new revision at the original count;
5. **roll back** (the verdict, or the operator): written ahead, then the canary's workers stop consuming at once (a
   fence scoped to its revision, then ``cancel_consumer``), finish what they run, and the pool goes back to 100 %
   old at the original count. Exit :data:`~celeryops.core.errors.EXIT_CANARY_ROLLED_BACK`;
6. **inconclusive** (no verdict by ``max_duration``, its look included). In the console the run pauses for the
   operator (promote, roll back); a headless run ends :data:`~celeryops.core.errors.EXIT_CANARY_PAUSED` with both
   revisions consuming, for ``celeryops resume`` (the analysis goes on from the recorded counts) or ``celeryops
   abort`` (the canary is taken away).

Processing never pauses: the old revision keeps every instance until the canary is promoted or removed.
``abort`` (from any machine, after Ctrl-C, SIGTERM, SIGKILL or a lost machine) removes the canary with the
overlap's retirement, and a canary still busy is kept held (it never consumes again) until the next ``abort``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from celeryops.adapters.canaryevents import OutcomeCollector
from celeryops.core.canary import CanarySettings, RevisionCounts, run_peak
from celeryops.core.config import Config, Target
from celeryops.core.errors import (
    EXIT_CANARY_PAUSED,
    EXIT_CANARY_ROLLED_BACK,
    EXIT_DEPLOY,
    EXIT_OK,
)
from celeryops.core.events import Notice, RunFinished, StageStarted
from celeryops.ops.journal import Run
from celeryops.ops.run.analysis.look import look_event
from celeryops.ops.run.analysis.rules import Judgement, judge, split_counts
from celeryops.ops.run.analysis.sources import crashed_workers, registry_revisions
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.decisions import DecisionAction, PauseCanary, PromoteNow, RollbackNow, decisions_of
from celeryops.ops.run.pool.checks import begin_deploy, deploy_checks
from celeryops.ops.run.pool.pool import Ending, Pool
from celeryops.ops.run.pool.progress import ticking
from celeryops.ops.run.pool.recover import abort_plan, guarded, recovery_step, taken_over, unforced
from celeryops.ops.run.pool.rules import Plan, Step
from celeryops.ops.run.pool.steps import promote, resumed, scale_up, wait_new
from celeryops.ops.run.pool.switch import (
    Start,
    abort_switch,
    attempt,
    finish_cutover,
    hand_over,
    open_pool_run,
    pool_destination,
    resume_switch,
    retire_new,
)
from celeryops.ops.run.recovery import RecoveryPlan
from celeryops.ops.run.strategies.base import OnePool

LOOK = "canary_look"  # a journal note: one look's counts
VERDICT = "canary_verdict"  # a journal note, written before the verdict is acted on
Outcome = Literal["promote", "rollback", "paused"]


@dataclass
class Analysis:
    """What the journal holds of a canary's analysis: the last look's number, the seconds of canary judged, the
    cumulative counts then (by revision, and by revision and task name; runtimes are not journaled), the canary
    workers seen crashed, and the verdict written ahead (None: none yet)."""

    look: int = 0
    elapsed: float = 0.0
    by_revision: dict[str, RevisionCounts] = field(default_factory=dict)
    by_task: dict[tuple[str, str], RevisionCounts] = field(default_factory=dict)
    crashed: set[str] = field(default_factory=set)
    verdict: str | None = None
    last: str = ""  # the last look's verdict

    def budget(self, settings: CanarySettings) -> CanarySettings:
        """The settings a resumed analysis judges by: an analysis that ended inconclusive gets another
        ``max_duration`` from where it stopped (the operator asked to judge it longer)."""
        if self.last != "inconclusive":
            return settings
        return replace(settings, max_duration=self.elapsed + settings.max_duration)

    def note(self) -> dict[str, Any]:
        return {LOOK: self.look, "elapsed": round(self.elapsed, 3), "crashed": sorted(self.crashed),
                "counts": {rev: c.to_dict() for rev, c in self.by_revision.items()},
                "tasks": [[rev, name, c.to_dict()] for (rev, name), c in self.by_task.items()]}


def analysis_of(run: Run) -> Analysis:
    """The canary's analysis as ``run``'s journal records it."""
    found = Analysis()
    for rec in run.records:
        if rec.kind != "note":
            continue
        data = rec.payload
        if LOOK in data:
            found.look = int(data.get(LOOK) or 0)
            found.elapsed = float(data.get("elapsed") or 0.0)
            found.crashed = {str(h) for h in data.get("crashed") or ()}
            found.by_revision = {str(rev): RevisionCounts.from_dict(c) for rev, c in (data.get("counts") or {}).items()}
            found.by_task = {(str(rev), str(name)): RevisionCounts.from_dict(c)
                             for rev, name, c in data.get("tasks") or ()}
            found.last = str(data.get("verdict") or "")
        if VERDICT in data:
            found.verdict = str(data[VERDICT])
    return found


def _added(base: dict[Any, RevisionCounts], fresh: dict[Any, RevisionCounts]) -> dict[Any, RevisionCounts]:
    return {key: base.get(key, RevisionCounts()) + fresh.get(key, RevisionCounts()) for key in {*base, *fresh}}


@dataclass
class CanaryFlow:
    """The canary deploy of worker pool ``pool`` (its run opened), judged by ``settings``."""

    pool: Pool
    settings: CanarySettings
    by_operator: bool = False  # the verdict acted on was the operator's (P / B), not the analysis'

    @classmethod
    def of(cls, ctx: RunContext, run: Run, target: Target | None = None) -> CanaryFlow:
        recorded = run.settings.get("canary")
        settings = CanarySettings.from_dict(recorded) if isinstance(recorded, dict) else ctx.config.canary
        return cls(Pool.of(ctx, run, target, keep_new_held=True), settings)  # a canary taken away never consumes

    @property
    def ctx(self) -> RunContext:
        return self.pool.ctx

    # -- the flow ----------------------------------------------------------------------------------------------

    async def forward(self, start: Start, plan: Plan | None = None) -> Ending:
        """From ``start``: a few instances of the new revision beside every old one, until they consume, the
        analysis, then its rollback, its pause, or its promotion (the overlap's peak) and the overlap's hand-over
        (the old revision drained, the cutover)."""
        pool = self.pool

        async def work() -> Ending:
            now = await scale_up(pool, pool_destination(await pool.run()), beside=self.settings.instances) \
                if start == "up" or plan is None else await resumed(pool, plan)
            async with ticking(pool, now):
                if start in ("up", "wait"):
                    await wait_new(pool, now)
                    outcome = await self.analyse(now)
                    if outcome == "rollback":
                        return await self.rolled_back(now)
                    if outcome == "paused":
                        return self.paused(now)
                if start != "drain" and now.beside:
                    now = await promote(pool, now)
            return await hand_over(pool, now, skip_wait=True, late=" after the canary was promoted")

        return await attempt(pool, work)

    async def recover(self, *, resume: bool) -> Ending:
        """Abort (``resume`` False) or resume by the pool's rules; then the analysis goes on from the recorded
        counts, or a verdict written ahead is carried out (resume), or the canary is taken away (abort)."""
        got = await recovery_step(self.pool, resume=resume)
        if isinstance(got, Ending):
            return got
        if got.step == "start" or got.plan is None:
            return await self.forward("up")
        if got.step == "cutover":
            return await finish_cutover(self.pool, got.plan)
        return await self.go_on(got.plan, got.step, resume=resume)

    async def go_on(self, plan: Plan, step: Step, *, resume: bool) -> Ending:
        verdict = analysis_of(await self.pool.run()).verdict
        if step in ("wait_new", "drain_old") and verdict != "rollback":
            start: Start = "drain" if step == "drain_old" else (
                "promote" if verdict == "promote" else "wait")
            return await self.forward(start, plan)
        sentence, done = await retire_new(self.pool, plan)
        if verdict == "rollback" and done and resume:
            return Ending("canary_rolled_back", EXIT_CANARY_ROLLED_BACK, f"The canary was rolled back: "
                          f"{sentence[:1].lower()}{sentence[1:]}",
                          action="retire")
        if resume:
            return Ending("deploy_failed", EXIT_DEPLOY, f"The canary deploy did not take place: {sentence}")
        return Ending("aborted" if done else "deploy_failed", EXIT_OK if done else EXIT_DEPLOY, sentence,
                      action="retire" if done else "ask")

    def paused(self, plan: Plan) -> Ending:
        return Ending("canary_paused", EXIT_CANARY_PAUSED, f"The canary had no verdict within "
                      f"{self.settings.max_duration:g} s, so it was not promoted: {plan.new} runs "
                      f"{plan.new_count} instance(s) beside {plan.count} of {plan.old_names} and both consume; run "
                      "`celeryops resume` to judge it longer, or `celeryops abort` to take the canary away.",
                      action="ask")

    async def rolled_back(self, plan: Plan) -> Ending:
        sentence, done = await retire_new(self.pool, plan)
        if not done:
            return Ending("canary_rolled_back", EXIT_CANARY_ROLLED_BACK, f"The canary is being rolled back: "
                          f"{sentence}", action="ask")
        by = "the operator" if self.by_operator else "the analysis"
        return Ending("canary_rolled_back", EXIT_CANARY_ROLLED_BACK, f"The canary was rolled back by {by}: "
                      f"{sentence[:1].lower()}{sentence[1:]}", action="retire")

    # -- the analysis ------------------------------------------------------------------------------------------

    async def analyse(self, plan: Plan) -> Outcome:
        """Look every ``look_interval`` until a verdict (or the operator's decision); the verdict is written ahead.
        ``paused``: inconclusive with no operator to ask (a headless run)."""
        pool = self.pool
        recorded = analysis_of(await pool.run())
        settings = recorded.budget(self.settings)
        if recorded.verdict in ("promote", "rollback"):
            return recorded.verdict  # type: ignore[return-value]
        coord = pool.runner.coord
        pool.emit(StageStarted(stage="canary", detail=f"{plan.new} judged against {plan.old_names}"))
        collector = OutcomeCollector(pool.runner.fleet.app, registry_revisions(coord, pool.runner.fleet_name)
                                     if coord is not None else dict)
        await asyncio.to_thread(collector.start)
        decisions = decisions_of(self.ctx.operator)
        paused = False
        began, judged = time.monotonic(), recorded.elapsed
        try:
            while True:
                decision = await decisions.next(settings.look_interval) if decisions is not None else None
                if decision is None and decisions is None:
                    await asyncio.sleep(settings.look_interval)
                if isinstance(decision, PromoteNow | RollbackNow):
                    chosen: Outcome = "promote" if isinstance(decision, PromoteNow) else "rollback"
                    self.by_operator = True
                    await self._verdict(chosen, "operator", f"The operator chose to {decision.action}.")
                    return chosen
                if isinstance(decision, PauseCanary):
                    paused = decision.paused
                    pool.emit(Notice(level="info", message="Canary paused: the looks go on, no automatic verdict."
                                     if paused else "Canary resumed: the looks decide again."))
                    continue
                look = await self._look(plan, settings, recorded, collector,
                                        judged + time.monotonic() - began, paused)
                if paused:
                    continue
                if look.decided:
                    outcome: Outcome = "promote" if look.verdict == "promote" else "rollback"
                    await self._verdict(outcome, look.rule, look.reason)
                    return outcome
                if look.verdict == "inconclusive":
                    if decisions is None:
                        return "paused"
                    paused = True
                    pool.emit(Notice(level="warning", message=f"{look.reason} Promote (P) or roll back (B)."))
        finally:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(collector.stop)

    async def _look(self, plan: Plan, settings: CanarySettings, recorded: Analysis,
                    collector: OutcomeCollector, elapsed: float, paused: bool) -> Judgement:
        """One look: the counts (journaled first), the judge's verdict, the ``canary_look`` event. ``recorded``:
        the analysis the journal held when this process took it over (its counts are added to the collector's)."""
        now = Analysis(look=recorded.look + 1, elapsed=elapsed,
                       by_revision=_added(recorded.by_revision, collector.counts()),
                       by_task=_added(recorded.by_task, collector.counts_by_task()), crashed=set(recorded.crashed))
        pool = self.pool
        coord = pool.runner.coord
        if coord is not None:
            with contextlib.suppress(Exception):  # a crash count missed at one look is counted at the next
                now.crashed |= set(await asyncio.to_thread(crashed_workers, coord, plan.new, pool.runner.fleet_name))
        olds = tuple(rev for rev in now.by_revision if rev and rev != plan.new) or (plan.old,)
        baseline, canary = split_counts(now.by_revision, plan.new, olds)
        judgement = judge(baseline, canary, crashes=len(now.crashed), look=now.look, elapsed=now.elapsed,
                          settings=settings)
        await pool.journal.note(pool.run_id, {**now.note(), "verdict": judgement.verdict})
        recorded.look, recorded.crashed = now.look, now.crashed  # the next look counts from here
        pool.emit(look_event(judgement, target=plan.target, baseline=plan.old, canary=plan.new,
                             by_revision=now.by_revision, by_task=now.by_task, baseline_revisions=olds, paused=paused))
        return judgement

    async def _verdict(self, verdict: str, rule: str, reason: str) -> None:
        await self.pool.journal.note(self.pool.run_id, {VERDICT: verdict, "rule": rule, "reason": reason})
        self.pool.emit(Notice(level="warning" if verdict == "rollback" else "info", message=reason))


@dataclass(frozen=True)
class CanaryStrategy(OnePool):
    """``strategy = "canary"``: judged by task outcomes per revision, then promoted or rolled back. A rollback of its
    target (after a promotion) goes back the overlap's way: no pause."""

    name: str = "canary"
    decisions: tuple[DecisionAction, ...] = ("promote", "rollback", "pause", "resume")
    demo: str = ("as a canary (one new instance judged by its task outcomes, then promoted or rolled back; P / B on "
                 "its screen)")
    aside: str = " (canary: a few instances of the new revision judged beside the old ones)"
    go: str = "Press G to start the canary: a few new instances first, judged by their tasks."
    plan: str = ("{peak}A canary of{release} comes up beside the old revision (no old instance is taken away) and "
                 "consumes; every task's outcome is credited to the revision that ran it and judged every look. If the "
                 "canary fails more often than the old revision beyond chance, raises a new exception repeatedly or "
                 "crashes, its workers stop taking tasks at once, finish what they run, and the pool goes back to the "
                 "old revision. Once enough canary tasks show no worse failure rate, it is promoted as an overlap: the "
                 "old revision drains while the new one consumes, then every instance moves to it. No verdict by max "
                 "duration: it pauses for you (P promotes, B rolls back).")
    resume_label: str = "Resume the canary"
    resume_detail: str = ("Ask Cloud Run how the pool is and continue from the journal: the analysis goes on from the "
                          "recorded counts, or a verdict written ahead is carried out (what `celeryops resume` does).")
    retire_label: str = "Abort: take the canary away"
    cutover_label: str = "Abort: finish the promotion's cutover"

    def peak(self, count: int, config: Config) -> int:
        return run_peak(count, config.canary.instances)  # its promotion's: the most the run can reach

    async def deploy(self, ctx: RunContext, release: str, targets: tuple[Target, ...]) -> RunFinished:
        """Preflight (the pool's checks at the canary's peak), the operator's go, then the canary."""
        settings = ctx.config.canary
        target, sha, destination = await begin_deploy(ctx, self.name, release, targets)
        ended = await ctx.checked(deploy_checks(ctx, target, destination, release, sha, beside=settings.instances))
        if ended is not None:
            return ended
        run = await open_pool_run(ctx, target, destination, strategy=self.name, release=release,
                                  settings={"sha": sha, "canary": settings.to_dict()})
        flow = CanaryFlow.of(ctx, run, target)
        try:
            ending = await guarded(flow.pool, lambda: flow.forward("up"), lambda: flow.recover(resume=False))
        finally:
            await ctx.close()
        return flow.pool.finish(ending)

    async def resume(self, ctx: RunContext, run: Run) -> RunFinished:
        if run.kind == "rollback":
            return await resume_switch(ctx, run)
        flow = CanaryFlow.of(ctx, run)
        return flow.pool.finish(await taken_over(flow.pool, lambda: flow.recover(resume=True),
                                                 lambda: flow.recover(resume=False)))

    async def abort(self, ctx: RunContext, run: Run, *, force_restore: bool = False) -> RecoveryPlan:
        if run.kind == "rollback":
            return await abort_switch(ctx, run, force_restore=force_restore)
        flow = CanaryFlow.of(ctx, run)
        unforced(flow.pool, force_restore)
        return abort_plan(await taken_over(flow.pool, lambda: flow.recover(resume=False),
                                           lambda: flow.recover(resume=False)))


__all__ = ["Analysis", "CanaryFlow", "CanaryStrategy", "analysis_of"]
