"""The overlap deploy of a Cloud Run worker pool: the new revision comes up beside the old one and consumes, only
the old revision's workers stop taking tasks, and the old instances are taken away once they are idle by the
drain's own rules. Processing never pauses, and no task is killed.

The flow (each pool update and each stop written ahead in the journal; the rules in
:mod:`celeryops.ops.run.overlap_rules`):

1. preflight: the drain deploy's checks, with the overlap's ``traffic`` (the pool runs one revision; the peak),
   ``validate`` (the scale-up, validate only), ``fence`` (required on every worker) and ``mixed_versions``;
2. ``overlapping``: one update names the new revision up front and runs it beside the old one at twice the count,
   split 50/50 (the old revision keeps every instance); then wait until the new revision's workers consume the old
   revision's queues, one per instance at least;
3. ``stopping`` / ``draining`` / ``drained``: a fence scoped to the old revision (the new one exempt) and
   ``cancel_consumer`` sent to the old revision's workers by name, re-sent to old workers that appear; drained by
   the drain's rules over the old revision's workers alone;
4. ``cutting_over``: the fence is parked (the old workers stay held even if this process dies), one update puts
   every instance on the new revision at the original count; once the old workers left, the fence is lifted.

Retiring the new revision (abort, the old revision's drain timing out, the new revision failing to start or to
consume): the old revision's consumers come back first, then the new revision's workers are held and drained (a
fence scoped to it), then one update puts the pool back on the old revision. If the new revision stays busy past
max wait, its consumers come back too and both keep consuming (nothing lost, nothing stopped; the run stays open).

Interrupted (Ctrl-C, SIGTERM, SIGHUP), the flow applies the abort's rules before the process ends; killed, the next
``celeryops abort`` / ``resume`` from any machine does, from the journal the fleet holds.

The strategy object is :class:`OverlapStrategy` (in the registry, :mod:`celeryops.ops.run.strategies`); the flow is
:class:`OverlapFlow`, on the pool mechanics of :mod:`celeryops.ops.run.pool`. :meth:`OverlapFlow.move` takes what
the pool moves to (:class:`Destination`: a new revision made from an image, or an existing revision) for a flow that
has its own preflight (a rollback: :class:`~celeryops.ops.run.rollback.OverlapStrategy`). A rollback run (``kind``
rollback in its settings) is told as one (:class:`Words`: the deployed revision, the previous one; outcomes
``rolled_back`` / ``rollback_failed``, a ``target`` event with ``"rolled_back": true``), and the split its cutover
pins is recorded as celeryops' own, as is the one a retirement pins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celeryops.core.config import Target
from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK
from celeryops.core.events import RunFinished, StageStarted
from celeryops.ops.journal import Run
from celeryops.ops.run.overlap_rules import Plan, Step, overlap_target
from celeryops.ops.run.pool.base import Destination, Ending, PoolStrategy, new_revision_name
from celeryops.ops.run.pool.steps import PoolSteps


class OverlapFlow(PoolSteps):
    """The overlap deploy of one worker pool, in a run context."""

    # -- entry points ------------------------------------------------------------------------------------------

    async def deploy(self, release: str, targets: tuple[Target, ...]) -> RunFinished:
        """Preflight (the overlap's checks), the operator's go, then :meth:`move` to a new revision of the release's
        image."""
        target = overlap_target(targets)
        self.emit(StageStarted(stage="preflight", detail=f"release {release}, overlap on {target.name}",
                               strategy="overlap"))
        sha = await self.ctx.release_sha(release)
        destination = Destination(new_revision_name(target, sha), target.image_for(sha, release, release))
        ended = await self.ctx.checked(self._checks(target, destination, release, sha))
        if ended is not None:
            return ended
        return await self.move(target, destination, release=release, settings={"sha": sha})  # closes them

    async def move(self, target: Target, destination: Destination, *, release: str | None,
                   settings: Mapping[str, Any] | None = None) -> RunFinished:
        """Open the run (the lease held), move the pool to ``destination``, end the run. Interrupted: the abort's
        rules, before the coroutine ends."""
        drain = self.ctx.config.drain
        run = await self.runner.open_run(release=release, settings={
            "strategy": "overlap", "targets": [target.name], "new_revision": destination.revision,
            "image": destination.image, "queues": [], "forget": [], "interval": drain.interval,
            "streak": drain.streak, "max_wait": drain.max_wait, **dict(settings or {})})
        self._kind(run)
        try:
            ending = await self._guarded(run, target, lambda: self._forward(run, target, "up"))
        finally:
            await self._close()
        return self._finish(ending)

    # -- the flow ----------------------------------------------------------------------------------------------

    async def _go_on(self, run: Run, target: Target, plan: Plan, step: Step, *, resume: bool) -> Ending:
        """Wait for the new revision or drain the old one again (resume), or retire the new one."""
        if step in ("wait_new", "drain_old"):
            return await self._forward(run, target, "wait" if step == "wait_new" else "drain", plan)
        sentence, done = await self._retire(run, target, plan)
        if resume:  # the new revision failed to start, or a retirement was begun: the deploy did not happen
            return Ending("deploy_failed", EXIT_DEPLOY, f"The {self._words.flow} did not take place: {sentence}")
        return Ending("aborted" if done else "deploy_failed", EXIT_OK if done else EXIT_DEPLOY, sentence,
                      action="retire" if done else "ask")


#: ``strategy = "overlap"``: the new revision beside the old one, the old one drained, then the cutover.
OverlapStrategy = PoolStrategy(
    name="overlap", flow=OverlapFlow, resume_label="Resume the overlap deploy",
    resume_detail="Ask Cloud Run how the pool is and continue from the journal: wait for the new revision, drain the "
                  "old one again, or finish the cutover (what `celeryops resume` does).",
    retire_label="Abort: retire the new revision", cutover_label="Abort: finish the cutover")


__all__ = ["OverlapFlow", "OverlapStrategy"]
