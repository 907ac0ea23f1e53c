"""``strategy = "overlap"``: the overlap deploy of a Cloud Run worker pool. The new revision comes up beside the old
one and consumes, only the old revision's workers stop taking tasks, and the old instances are taken away once they
are idle by the drain's own rules. Processing never pauses, and no task is killed.

As the pool's steps (:mod:`celeryops.ops.run.pool`; each pool update and each stop written ahead in the journal, the
rules in :mod:`celeryops.ops.run.pool.rules`):

1. preflight: the drain deploy's checks, with the pool's ``traffic`` (the pool runs one revision; the peak),
   ``validate`` (the scale-up, validate only), ``fence`` (required on every worker) and ``mixed_versions``;
2. :func:`~celeryops.ops.run.pool.steps.scale_up` (``overlapping``): one update names the new revision up front and
   runs it beside the old one at twice the count, split 50/50 (the old revision keeps every instance);
3. :func:`~celeryops.ops.run.pool.switch.hand_over`: until the new revision's workers consume the old revision's
   queues, one per instance at least; then (``stopping`` / ``draining`` / ``drained``) a fence scoped to the old
   revision and ``cancel_consumer`` sent to its workers by name, drained by the drain's rules over them alone;
   then (``cutting_over``) one update puts every instance on the new revision at the original count, and once the
   old workers left the fence is lifted.

Retiring the new revision (abort, the old revision's drain timing out, the new revision failing to start or to
consume): the old revision's consumers come back first, then the new revision's workers are held and drained, then
one update puts the pool back on the old revision. If the new revision stays busy past max wait, its consumers come
back too and both keep consuming (nothing lost, nothing stopped; the run stays open).

Interrupted (Ctrl-C, SIGTERM, SIGHUP), the flow applies the abort's rules before the process ends; killed, the next
``celeryops abort`` / ``resume`` from any machine does, from the journal the fleet holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from celeryops.core.config import Config, Target
from celeryops.core.events import RunFinished
from celeryops.ops.journal import Run
from celeryops.ops.run.context import RunContext
from celeryops.ops.run.decisions import DecisionAction
from celeryops.ops.run.pool.checks import begin_deploy, deploy_checks
from celeryops.ops.run.pool.switch import abort_switch, move, resume_switch
from celeryops.ops.run.recovery import RecoveryPlan
from celeryops.ops.run.strategies.base import OnePool


@dataclass(frozen=True)
class OverlapStrategy(OnePool):
    """``strategy = "overlap"``: the new revision beside the old one, the old one drained, then the cutover."""

    name: str = "overlap"
    decisions: tuple[DecisionAction, ...] = ()
    demo: str = "without a pause (the new revision consumes while the old one drains)"
    aside: str = " (overlap: the new revision consumes beside the old one)"
    go: str = "Press G to start the overlap: the new revision first, then the old one drains."
    plan: str = ("{peak}The new revision of{release} comes up beside the old one (no old instance is taken away) and "
                 "starts consuming. Only then do the old revision's workers stop taking new tasks: their running and "
                 "prefetched tasks finish while the new revision consumes, so processing never pauses. Once the old "
                 "revision is idle (the drain's empty streak), every instance moves to the new revision, back to the "
                 "original count. Nothing is killed: if the old revision is not idle within max wait, or the new one "
                 "does not consume, the old revision consumes again and the new one is retired.")
    resume_label: str = "Resume the overlap deploy"
    resume_detail: str = ("Ask Cloud Run how the pool is and continue from the journal: wait for the new revision, "
                          "drain the old one again, or finish the cutover (what `celeryops resume` does).")
    retire_label: str = "Abort: retire the new revision"
    cutover_label: str = "Abort: finish the cutover"

    def peak(self, count: int, config: Config) -> int:
        return 2 * count  # as many new instances as old ones, beside them

    async def deploy(self, ctx: RunContext, release: str, targets: tuple[Target, ...]) -> RunFinished:
        """Preflight (the pool's checks), the operator's go, then the pool moved to a new revision of the release's
        image: scale up, hand over."""
        target, sha, destination = await begin_deploy(ctx, self.name, release, targets)
        ended = await ctx.checked(deploy_checks(ctx, target, destination, release, sha))
        if ended is not None:
            return ended
        return await move(ctx, target, destination, strategy=self.name, release=release, settings={"sha": sha})

    async def resume(self, ctx: RunContext, run: Run) -> RunFinished:
        return await resume_switch(ctx, run)

    async def abort(self, ctx: RunContext, run: Run, *, force_restore: bool = False) -> RecoveryPlan:
        return await abort_switch(ctx, run, force_restore=force_restore)


__all__ = ["OverlapStrategy"]
