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
   the judge (:func:`~celeryops.ops.run.canary_rules.judge`, pure) looks at the counts, a ``canary_look`` event
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
from celeryops.adapters.deploy.base import DeployError, PoolUpdate, short_revision
from celeryops.core.canary import CanarySettings, RevisionCounts
from celeryops.core.config import Target
from celeryops.core.errors import (
    EXIT_CANARY_PAUSED,
    EXIT_CANARY_ROLLED_BACK,
    EXIT_DEPLOY,
    EXIT_OK,
)
from celeryops.core.events import Notice, RunFinished, StageStarted
from celeryops.ops.journal import OVERLAP_UP, Run
from celeryops.ops.run.canary_decisions import PauseCanary, PromoteNow, RollbackNow, decisions_of
from celeryops.ops.run.canary_look import look_event
from celeryops.ops.run.canary_rules import Judgement, judge, split_counts
from celeryops.ops.run.canary_sources import crashed_workers, registry_revisions
from celeryops.ops.run.overlap_rules import Plan, Step, overlap_target
from celeryops.ops.run.pool.base import Destination, Ending, PoolStrategy, _Stop, new_revision_name
from celeryops.ops.run.pool.steps import PoolSteps, Start

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


class CanaryFlow(PoolSteps):
    """The canary deploy of one worker pool, in a run context."""

    _hold_new = True  # a canary taken away never consumes again, busy or not
    _by_operator = False  # the verdict acted on was the operator's (P / B), not the analysis'

    # -- entry points ------------------------------------------------------------------------------------------

    async def deploy(self, release: str, targets: tuple[Target, ...]) -> RunFinished:
        """Preflight (the overlap's checks at the canary's peak), the operator's go, then the canary."""
        target = overlap_target(targets, strategy="canary")
        settings = self.ctx.config.canary
        self.emit(StageStarted(stage="preflight", detail=f"release {release}, canary on {target.name}",
                               strategy="canary"))
        sha = await self.ctx.release_sha(release)
        destination = Destination(new_revision_name(target, sha), target.image_for(sha, release, release))
        ended = await self.ctx.checked(self._checks(target, destination, release, sha,
                                                     canary=settings.instances))
        if ended is not None:
            return ended
        drain = self.ctx.config.drain
        run = await self.runner.open_run(release=release, settings={
            "strategy": "canary", "targets": [target.name], "new_revision": destination.revision,
            "image": destination.image, "queues": [], "forget": [], "interval": drain.interval,
            "streak": drain.streak, "max_wait": drain.max_wait, "sha": sha, "canary": settings.to_dict()})
        try:
            ending = await self._guarded(run, target, lambda: self._forward(run, target, "up"))
        finally:
            await self._close()
        return self._finish(ending)

    # -- the flow ----------------------------------------------------------------------------------------------

    def _canary_settings(self, run: Run) -> CanarySettings:
        recorded = run.settings.get("canary")
        return CanarySettings.from_dict(recorded) if isinstance(recorded, dict) else self.ctx.config.canary

    async def _go_on(self, run: Run, target: Target, plan: Plan, step: Step, *, resume: bool) -> Ending:
        """Resume: the analysis goes on from the recorded counts, or a verdict written ahead is carried out; abort:
        the canary is taken away."""
        verdict = analysis_of(run).verdict
        if step in ("wait_new", "drain_old") and verdict != "rollback":
            start: Start = "drain" if step == "drain_old" else (
                "promote" if verdict == "promote" else "wait")
            return await self._forward(run, target, start, plan)
        sentence, done = await self._retire(run, target, plan)
        if verdict == "rollback" and done and resume:
            return Ending("canary_rolled_back", EXIT_CANARY_ROLLED_BACK, f"The canary was rolled back: "
                          f"{sentence[:1].lower()}{sentence[1:]}",
                          action="retire")
        if resume:
            return Ending("deploy_failed", EXIT_DEPLOY, f"The canary deploy did not take place: {sentence}")
        return Ending("aborted" if done else "deploy_failed", EXIT_OK if done else EXIT_DEPLOY, sentence,
                      action="retire" if done else "ask")

    _late = " after the canary was promoted"

    def _canary_count(self, run: Run) -> int:
        return self._canary_settings(run).instances

    async def _before_drain(self, run: Run, target: Target, plan: Plan, start: Start) -> Plan | Ending:
        """The canary's: until it consumes, the analysis, then its rollback, its pause, or its promotion (the overlap's
        peak: the old revision's drain follows)."""
        if start in ("up", "wait"):
            await self._wait_new(run, plan)
            outcome = await self._analyse(run, target, plan)
            if outcome == "rollback":
                return await self._rolled_back(run, target, plan)
            if outcome == "paused":
                return self._paused(run, plan)
        if start != "drain" and plan.canary:
            plan = await self._promote(run, target, plan)
        return plan

    def _paused(self, run: Run, plan: Plan) -> Ending:
        return Ending("canary_paused", EXIT_CANARY_PAUSED, f"The canary had no verdict within "
                      f"{self._canary_settings(run).max_duration:g} s, so it was not promoted: {plan.new} runs "
                      f"{plan.new_count} instance(s) beside {plan.count} of {plan.old} and both consume; run "
                      "`celeryops resume` to judge it longer, or `celeryops abort` to take the canary away.",
                      action="ask")

    async def _rolled_back(self, run: Run, target: Target, plan: Plan) -> Ending:
        sentence, done = await self._retire(run, target, plan)
        if not done:
            return Ending("canary_rolled_back", EXIT_CANARY_ROLLED_BACK, f"The canary is being rolled back: "
                          f"{sentence}", action="ask")
        by = "the operator" if self._by_operator else "the analysis"
        return Ending("canary_rolled_back", EXIT_CANARY_ROLLED_BACK, f"The canary was rolled back by {by}: "
                      f"{sentence[:1].lower()}{sentence[1:]}", action="retire")

    async def _promote(self, run: Run, target: Target, plan: Plan) -> Plan:
        """The promotion's update (written ahead as the overlap's ``overlap_up`` of the promoted plan): as many
        instances of the new revision as of the old one, then until they consume."""
        full = plan.promoted()
        self.emit(StageStarted(stage="overlap", detail=f"promoting {plan.new} on {target.name}"))
        intent = await self.runner.journal.aio.intend(run.id, OVERLAP_UP, full.payload(promote=True))
        self._step("promoting", full, f"{full.peak} instances: {plan.new} {full.count} beside {plan.old} "
                   f"{full.count}", instances=await self._instances(target, full), split=dict(plan.up_split))
        try:
            result = await self.deployer(target).update_worker_pool(
                target, PoolUpdate(instance_count=full.peak, split=full.up_split), self.emit)
        except DeployError as err:
            await self.runner.journal.aio.settle(intent, {"ok": False, "error": str(err)})
            raise _Stop(f"Cloud Run could not promote {plan.new}: {err}", logs_url=err.logs_url, plan=full) from None
        await self.runner.journal.aio.settle(intent, {"ok": True, "revision": short_revision(result.revision)})
        await self._wait_new(run, full)
        return full

    # -- the analysis ------------------------------------------------------------------------------------------

    async def _analyse(self, run: Run, target: Target, plan: Plan) -> Outcome:
        """Look every ``look_interval`` until a verdict (or the operator's decision); the verdict is written ahead.
        ``paused``: inconclusive with no operator to ask (a headless run)."""
        recorded = analysis_of(await self.runner.journal.aio.get(run.id))
        settings = recorded.budget(self._canary_settings(run))
        if recorded.verdict in ("promote", "rollback"):
            return recorded.verdict  # type: ignore[return-value]
        coord = self.runner.coord
        self.emit(StageStarted(stage="canary", detail=f"{plan.new} judged against {plan.old}"))
        collector = OutcomeCollector(self.runner.fleet.app, registry_revisions(coord, self.runner.fleet_name)
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
                    self._by_operator = True
                    await self._verdict(run, chosen, "operator", f"The operator chose to {decision.action}.")
                    return chosen
                if isinstance(decision, PauseCanary):
                    paused = decision.paused
                    self.emit(Notice(level="info", message="Canary paused: the looks go on, no automatic verdict."
                                     if paused else "Canary resumed: the looks decide again."))
                    continue
                look = await self._look(run, plan, settings, recorded, collector,
                                        judged + time.monotonic() - began, paused)
                if paused:
                    continue
                if look.decided:
                    outcome: Outcome = "promote" if look.verdict == "promote" else "rollback"
                    await self._verdict(run, outcome, look.rule, look.reason)
                    return outcome
                if look.verdict == "inconclusive":
                    if decisions is None:
                        return "paused"
                    paused = True
                    self.emit(Notice(level="warning", message=f"{look.reason} Promote (P) or roll back (B)."))
        finally:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(collector.stop)

    async def _look(self, run: Run, plan: Plan, settings: CanarySettings, recorded: Analysis,
                    collector: OutcomeCollector, elapsed: float, paused: bool) -> Judgement:
        """One look: the counts (journaled first), the judge's verdict, the ``canary_look`` event. ``recorded``:
        the analysis the journal held when this process took it over (its counts are added to the collector's)."""
        now = Analysis(look=recorded.look + 1, elapsed=elapsed,
                       by_revision=_added(recorded.by_revision, collector.counts()),
                       by_task=_added(recorded.by_task, collector.counts_by_task()), crashed=set(recorded.crashed))
        coord = self.runner.coord
        if coord is not None:
            with contextlib.suppress(Exception):  # a crash count missed at one look is counted at the next
                now.crashed |= set(await asyncio.to_thread(crashed_workers, coord, plan.new, self.runner.fleet_name))
        olds = tuple(rev for rev in now.by_revision if rev and rev != plan.new) or (plan.old,)
        baseline, canary = split_counts(now.by_revision, plan.new, olds)
        judgement = judge(baseline, canary, crashes=len(now.crashed), look=now.look, elapsed=now.elapsed,
                          settings=settings)
        await self.runner.journal.aio.note(run.id, {**now.note(), "verdict": judgement.verdict})
        recorded.look, recorded.crashed = now.look, now.crashed  # the next look counts from here
        self.emit(look_event(judgement, target=plan.target, baseline=plan.old, canary=plan.new,
                             by_revision=now.by_revision, by_task=now.by_task, baseline_revisions=olds, paused=paused))
        return judgement

    async def _verdict(self, run: Run, verdict: str, rule: str, reason: str) -> None:
        await self.runner.journal.aio.note(run.id, {VERDICT: verdict, "rule": rule, "reason": reason})
        self.emit(Notice(level="warning" if verdict == "rollback" else "info", message=reason))


#: ``strategy = "canary"``: judged by task outcomes per revision, then promoted or rolled back.
CanaryStrategy = PoolStrategy(
    name="canary", flow=CanaryFlow, resume_label="Resume the canary",
    resume_detail="Ask Cloud Run how the pool is and continue from the journal: the analysis goes on from the "
                  "recorded counts, or a verdict written ahead is carried out (what `celeryops resume` does).",
    retire_label="Abort: take the canary away", cutover_label="Abort: finish the promotion's cutover")


__all__ = ["Analysis", "CanaryFlow", "CanaryStrategy", "analysis_of"]
