"""The steps of a worker pool, as public functions of a :class:`~celeryops.ops.run.pool.pool.Pool` (the pool in one
run): any flow calls them in the order it needs, a strategy or not. Each pool update and each stop is written ahead
in the run journal (:meth:`RunContext.written_ahead <celeryops.ops.run.context.RunContext.written_ahead>`), so
recovery finds it.

By revision, for any flow:

- :func:`scale_to`: one update that runs exactly so many instances of each revision (a new one made from an image,
  named up front, if asked), written ahead under the intent the flow names;
- :func:`wait_consuming`: until a revision's workers consume (so many of them, covering those queues);
- :func:`drain_revision`: fence one revision and drain its workers by the drain's rules (the other revisions keep
  consuming); :func:`drain_revisions` a set of them as one; :func:`release` gives them their consumers back;
- :func:`hold`: a held revision stays held even if this process dies (the fence parked);
- :func:`take_away`: retire a drained, held revision: one update without it, until its workers are gone.

Two revisions on the pool (a :class:`~celeryops.ops.run.pool.rules.Plan`: from ``old`` to ``new``; ``old`` may be
celeryops' own cohorts, several revisions each at its count, moved as one), the steps
with the ``overlap`` events the console and ``--json`` show: :func:`scale_up`, :func:`wait_new`, :func:`drain_old`,
:func:`cut_over`, :func:`retire_new` (in :mod:`celeryops.ops.run.pool.switch`, with :func:`hand_over`, the overlap's
sequence from the new revision consuming to the cutover).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celeryops.adapters.deploy.base import DeployError, DeployResult, PoolUpdate, short_revision
from celeryops.adapters.taskevents import start_watch
from celeryops.core.config import Target
from celeryops.core.errors import EXIT_PREFLIGHT, UserError
from celeryops.core.events import DrainFinished, Event, StageStarted
from celeryops.core.splits import exact_split
from celeryops.ops.drain.engine import Drain, DrainResult
from celeryops.ops.drain.membership import held_by
from celeryops.ops.journal import CANCEL_CONSUMERS, OVERLAP_UP
from celeryops.ops.run.hooks import JournalHooks
from celeryops.ops.run.pool.cohorts import largest, read_cohorts
from celeryops.ops.run.pool.pool import Pool, Refused, Stop, cap
from celeryops.ops.run.pool.rules import Destination, Plan, progress_of
from celeryops.ops.run.runner import Runner, uncut


class RevisionHooks(JournalHooks):
    """The drain's write-ahead records, each stop tagged with the revision whose workers it stops (the first of
    them, with ``revisions`` naming them all, when a drain holds several)."""

    def __init__(self, runner: Runner, run_id: str, revisions: Sequence[str], exempt: str) -> None:
        async def raise_fence(queues: tuple[str, ...]) -> None:
            await runner.raise_fence(queues, only_revisions=tuple(revisions),
                                     exempt_revisions=(exempt,) if exempt else ())

        super().__init__(runner.journal, run_id, on_first_stop=raise_fence)
        self.revisions = tuple(revisions)

    async def before_stop(self, stops: dict[str, tuple[str, ...]], before: dict[str, tuple[str, ...]]) -> None:
        several = {"revisions": list(self.revisions)} if len(self.revisions) > 1 else {}
        await self.journal.aio.intend(self.run_id, CANCEL_CONSUMERS, {
            "stop": {w: sorted(q) for w, q in stops.items()}, "before": {w: sorted(q) for w, q in before.items()},
            "revision": self.revisions[0], **several})
        if self.on_first_stop is not None:
            first, self.on_first_stop = self.on_first_stop, None
            await first(tuple(sorted({q for qs in stops.values() for q in qs})))


# -- by revision, for any flow ---------------------------------------------------------------------------------


async def scale_to(pool: Pool, counts: Mapping[str, int], *, intent: str, payload: Mapping[str, Any],
                   new: Destination | None = None, owned_by: str = "", announce: Any = None) -> DeployResult:
    """One update of the pool that runs exactly ``counts[revision]`` instances of each revision (in that order; a
    revision left out runs none), written ahead as ``intent`` with ``payload`` and settled with the revision Cloud
    Run reports (``{"ok": False, "error": ...}`` and the DeployError raised again when it fails). ``new``: a
    revision made by this update, named up front, from ``new.image``. ``owned_by``: the split is recorded as
    celeryops' own (``celeryops/split``), left by that run. ``announce``: called once the intent is durable, right
    before the update is sent (an event that must not run ahead of the journal)."""
    change = PoolUpdate(image=new.image if new is not None else None,
                        revision=new.revision if new is not None and new.image else "",
                        instance_count=sum(counts.values()), split=exact_split(counts), owned_by=owned_by)

    async def act() -> DeployResult:
        if announce is not None:
            announce()
        return await pool.update(change)

    return await pool.written_ahead(intent, dict(payload), act,
                                    settle=lambda result: {"revision": short_revision(result.revision)})


class NotConsuming(Exception):
    """A revision's workers did not consume within the run's max wait (one sentence)."""


async def wait_consuming(pool: Pool, revision: str, *, workers: int, queues: Iterable[str] = (),
                         what: str = "") -> dict[str, tuple[str, ...]]:
    """Until at least ``workers`` live workers of ``revision`` consume, covering ``queues`` (the fence registry names
    them; ``active_queues`` says what they consume); returns them with their queues. Raises :class:`NotConsuming`
    after the run's max wait (``what``: how the sentence names the revision)."""
    settings = pool.settings
    deadline = time.monotonic() + settings.max_wait
    wanted = set(queues)
    fleet = pool.runner.fleet
    while True:
        names = (await pool.registry()).get(revision, ())
        replies = await fleet.active_queues(names) if names else {}
        consuming = {w: q for w, q in replies.items() if q}
        covered = {q for qs in consuming.values() for q in qs}
        if len(consuming) >= workers and wanted <= covered:
            return consuming
        if time.monotonic() > deadline:
            missing = f"; nobody consumes {', '.join(sorted(wanted - covered))}" if wanted - covered else ""
            raise NotConsuming(f"{cap(what or 'revision')} {revision} did not consume within {settings.max_wait:g} s "
                               f"({len(consuming)} of {workers} worker(s) consume{missing}; a crash loop? read the "
                               "revision's logs).")
        await asyncio.sleep(min(settings.interval, 1.0))


@dataclass
class Drained:
    """A revision's drain: its ``result`` (``outcome`` drained or timeout, what held it last), and the drain itself,
    whose stopped consumers :func:`release` gives back."""

    drain: Drain
    result: DrainResult

    @property
    def idle(self) -> bool:
        return self.result.outcome == "drained"

    @property
    def held_by(self) -> str:
        return held_by(self.result.last)


async def drain_revision(pool: Pool, revision: str, *, exempt: str = "",
                         prior: Mapping[str, Iterable[str]] | None = None, phases: bool = False) -> Drained:
    """Fence ``revision`` (a fence scoped to it, ``exempt`` never held) and stop its workers' consumers by name (each
    stop written ahead, tagged with the revision), then drain them by the drain's rules while every other revision
    consumes. ``prior``: consumers of it the run stopped already (a resume); ``phases``: record stopping / draining.
    Drained, its workers stay held (:func:`hold` parks the fence; :func:`release` gives them back)."""
    return await drain_revisions(pool, (revision,), exempt=exempt, prior=prior, phases=phases)


async def drain_revisions(pool: Pool, revisions: Sequence[str], *, exempt: str = "",
                          prior: Mapping[str, Iterable[str]] | None = None, phases: bool = False) -> Drained:
    """:func:`drain_revision` of a set of revisions at once (an overlap's old cohorts): one fence scoped to all of
    them, their workers stopped by name and drained as one, idle only once every one of them is."""
    runner = pool.runner
    wake = asyncio.Event()
    watch = await start_watch(runner.fleet.app, wake) if runner.settings.task_events else None

    def on_event(event: Event) -> None:
        if watch is not None:
            watch.on_event(event)
        pool.emit(event)

    drain = Drain(runner.fleet, pool.settings, forget=pool.forget, on_event=on_event,
                  hooks=RevisionHooks(runner, pool.run_id, revisions, exempt),
                  prior_stopped={w: tuple(sorted(q)) for w, q in (prior or {}).items()}, wake=wake,
                  restore_patience=runner.settings.recovery_patience, scope=pool.scope(*revisions),
                  scope_label=f"of revision {', '.join(revisions)}")
    runner._drain = drain  # the console's F (forget a dead worker) reaches it
    try:
        await drain.start()
        if phases and not await pool.past("draining"):
            await pool.phase("draining")
        return Drained(drain, await drain.run())
    finally:
        if watch is not None:
            await asyncio.to_thread(watch.stop)


async def release(pool: Pool, drained: Drained) -> None:
    """A drained (or timed-out) revision consumes again: the fence lifted first, then the consumers its drain
    stopped given back (neither cut short by a second interrupt)."""
    await uncut(pool.runner.lift_fence(pool.run_id))
    await uncut(drained.drain.restore())


async def hold(pool: Pool) -> None:
    """The revisions the run holds stay held even if this process dies meanwhile (the fence parked: it outlives
    the lease's heartbeat for the parked TTL)."""
    await pool.runner.park_fence()


async def take_away(pool: Pool, revision: str, keep: Mapping[str, int], *, intent: str,
                    payload: Mapping[str, Any], owned_by: str = "") -> None:
    """Retire ``revision``, drained and held: the fence parked, one update that runs exactly ``keep`` (written ahead
    as ``intent``), until its workers are gone, then the fence lifted."""
    await hold(pool)
    await scale_to(pool, keep, intent=intent, payload=payload, owned_by=owned_by)
    await pool.wait_gone(revision)
    await pool.runner.lift_fence(pool.run_id)


# -- two revisions on the pool: from plan.old to plan.new ------------------------------------------------------


def new_revision_name(target: Target, sha: str) -> str:
    """A new revision's name, chosen up front: ``<pool>-<short sha>-<4 hex>`` (Cloud Run wants a revision's name
    to start with its resource's)."""
    return f"{target.resource}-{sha[:7] or 'r'}-{secrets.token_hex(2)}"


async def scale_up(pool: Pool, destination: Destination, *, beside: int = 0) -> Plan:
    """Name the plan (from the revision that serves every instance now, or celeryops' own cohorts, each at its count:
    :mod:`~celeryops.ops.run.pool.cohorts`, to ``destination``), write it ahead (``overlap_up``) and send the one
    update that runs the new revision beside the old ones: as many instances as they have in all, or ``beside`` of
    them; the old revisions keep all of their instances. Raises :class:`Refused` when Cloud Run refused it before
    anything changed (the run is ended aborted), :class:`Stop` when it failed after."""
    target = pool.target
    state = await pool.state()
    served, count = state.served, state.instance_count or 0
    olds = {next(iter(served)): count} if len(served) == 1 else await read_cohorts(pool.ctx, target, state)
    if not olds or count <= 0 or destination.revision in olds:
        raise UserError(f"{target.display} does not run all of its instances on one revision or celeryops' own "
                        f"cohorts other than {destination.revision} ({served}, count {count}): nothing was changed; "
                        "run the preflight again.", EXIT_PREFLIGHT)
    old = largest(olds)
    plan = Plan(target=target.name, old=old, new=destination.revision, count=count, image=destination.image,
                split_before=state.traffic, beside=beside, cohorts=tuple(olds.items()) if len(olds) > 1 else ())
    names = plan.old_names
    if beside:
        each = f"{beside} instance(s) beside {count} ({plan.peak} while judged, as many as {names} if promoted)"
    else:
        each = f"{count} instance(s) beside their {count}" if plan.cohorts else f"{count} instance(s) each"
    pool.step("planned", plan, f"{plan.new} will run beside {names}: {each}, {plan.highest} at the peak",
              instances=dict(olds), split=served)
    pool.emit(StageStarted(stage="overlap", detail=f"{plan.new} beside {names} on {target.name}"))
    await pool.phase("overlapping")
    shares = " / ".join(f"{rev} {pct}%" for rev, pct in plan.up_split)
    try:
        await scale_to(pool, plan.up_counts, new=destination, intent=OVERLAP_UP, payload=plan.payload(
            before={"count": count, "split": [list(e) for e in state.traffic], "served": served}),
            announce=lambda: pool.step("scaling_up", plan, f"{plan.peak} instances, {shares}",
                                       instances=dict(olds), split=served))
    except DeployError as err:
        now = await pool.read()
        if now is not None and not now.reconciling and (
                plan.new not in now.revisions if plan.image else now.serves_exactly(olds)):
            await pool.runner.advance(pool.run_id, "aborted", reason="the pool update was refused")
            raise Refused(f"{err} The pool was left as it was.") from None
        raise Stop(f"Cloud Run could not bring {plan.new} up beside {names}: {err}", plan,
                   logs_url=err.logs_url) from None
    pool.step("scaled_up", plan, f"Cloud Run runs {plan.new} beside {names}",
              instances=await pool.instances(*plan.revisions), split=dict(plan.up_split))
    return plan


async def promote(pool: Pool, plan: Plan) -> Plan:
    """A few instances of the new revision become as many as the old one has (the overlap's peak): one update
    written ahead as the ``overlap_up`` of the promoted plan (``promote``: true), then until they consume."""
    full = plan.promoted()
    pool.emit(StageStarted(stage="overlap", detail=f"promoting {plan.new} on {pool.target.name}"))
    instances = await pool.instances(*plan.revisions)
    try:
        await scale_to(pool, full.up_counts, intent=OVERLAP_UP, payload=full.payload(promote=True),
                       announce=lambda: pool.step("promoting", full, f"{full.peak} instances: {plan.new} {full.count} "
                                                  f"beside {plan.old_names} {full.count}", instances=instances,
                                                  split=dict(plan.up_split)))
    except DeployError as err:
        raise Stop(f"Cloud Run could not promote {plan.new}: {err}", full, logs_url=err.logs_url) from None
    await wait_new(pool, full)
    return full


async def resumed(pool: Pool, plan: Plan) -> Plan:
    """A flow taken up again: an update still rolling out ends first; a new revision that failed stops it."""
    await pool.settled()
    now = await pool.read()
    if now is not None and now.revisions.get(plan.new) == "failed":
        raise Stop(f"{cap(pool.words.new)} {plan.new} failed to start.", plan)
    return plan


async def wait_new(pool: Pool, plan: Plan) -> None:
    """Until at least one worker per instance of the new revision consumes, covering every queue the old revision's
    workers consume (max wait: :class:`Stop`, the flow cannot go on)."""
    try:
        consuming = await wait_consuming(pool, plan.new, workers=plan.new_count,
                                         queues=await pool.queues_of(*plan.olds), what=pool.words.new)
    except NotConsuming as err:
        raise Stop(str(err), plan) from None
    pool.step("consuming", plan, f"{len(consuming)} worker(s) of {plan.new} consume "
              f"{', '.join(sorted({q for qs in consuming.values() for q in qs}))}",
              consuming=tuple(sorted(consuming)))


async def drain_old(pool: Pool, plan: Plan) -> str | None:
    """Stop and drain the old revision's workers alone (every old cohort's, as one). None: drained (they stay held);
    else what held the drain at max wait (their consumers restored: the caller retires the new revision)."""
    w, names = pool.words, plan.old_names
    pool.emit(StageStarted(stage="drain", detail=f"{w.old} {names}"))
    pool.step("stopping_old", plan, f"only the workers of {names} stop taking tasks; {plan.new} consumes")
    prior = progress_of(await pool.run()).old_stopped
    if not await pool.past("stopping"):
        await pool.phase("stopping")
    drained = await drain_revisions(pool, tuple(plan.olds), exempt=plan.new, prior=prior, phases=True)
    if drained.idle:
        await pool.phase("drained")
        pool.step("old_idle", plan, f"the workers of {names} are idle")
        pool.emit(DrainFinished(outcome="drained", elapsed=drained.result.elapsed, message=(
            f"{cap(w.old)} {names} is idle: every instance moves to {plan.new} next.")))
        return None
    what = drained.held_by
    await release(pool, drained)
    pool.emit(DrainFinished(outcome="timeout", elapsed=drained.result.elapsed, message=(
        f"{cap(w.old)} {names} was not idle within {pool.settings.max_wait:g} s, held by {what}: "
        f"nothing was killed, its consumers were restored; {w.new} is retired next.")))
    return what


__all__ = ["Drained", "NotConsuming", "RevisionHooks", "drain_old", "drain_revision", "drain_revisions", "hold",
           "new_revision_name", "promote", "release", "resumed", "scale_to", "scale_up", "take_away", "wait_consuming",
           "wait_new"]
