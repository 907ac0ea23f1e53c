"""The rules of two revisions on one worker pool: what a flow plans (:class:`Plan`, from the old revision to the new
one, the exact instance counts of each) and what ``abort`` and ``resume`` do with an interrupted run of an overlap or
canary deploy or a pool rollback, decided from its journal and what the worker pool reports now. Pure, no I/O (the
steps are :mod:`celeryops.ops.run.pool.steps`).

An overlap deploy moves a Cloud Run worker pool from its old revision to a new one without pausing processing (a
canary's first update runs a few instances of the new revision instead, its promotion the overlap's; a rollback's
"new" revision is the previous one, which exists):

1. ``overlap_up`` (written ahead): one update runs the new revision beside the old one, at twice the count with the
   split old 50 / new 50 (no old instance is taken away);
2. the new revision's workers consume;
3. ``cancel_consumers`` (written ahead, tagged with the old revision): only the old revision's workers stop taking
   tasks (a fence scoped to the old revision, and ``cancel_consumer`` sent to them by name), and are drained;
4. ``overlap_cutover`` (written ahead): every instance moves to the new revision at the original count.

Retiring the new revision (an abort, a timeout, a revision that failed) is ``overlap_revert`` (written ahead,
settled when done or given up): the old revision's consumers are restored, the new revision's held and drained,
then one update puts the pool back on the old revision.

| the journal holds | abort | resume |
| --- | --- | --- |
| no ``overlap_up`` (or it never took effect) | nothing to undo | start again at the update |
| ``overlap_up``, the old revision not stopped | retire the new revision | wait until the new one consumes, go on |
| ``overlap_up``, the old revision stopped | restore it, retire the new one | drain the old revision again, go on |
| ``overlap_up``, the new revision failed | retire it | retire it (the deploy cannot go on) |
| ``overlap_cutover`` (or the phase ``cutting_over``) | finish the cutover | finish the cutover |
| ``overlap_revert`` unsettled | finish the retirement | finish the retirement |
| ``overlap_revert`` given up (both consume) | retire the new revision | wait until the new one consumes, go on |

Whether an update took effect is the pool's to say (its revisions, whether it is reconciling); when Cloud Run does
not answer, nothing about the pool is decided (``ask``), though stopped consumers are still given back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from celeryops.adapters.deploy.base import DeployError, RevisionInfo, RolloutState, role_for
from celeryops.core.canary import canary_split, run_peak
from celeryops.core.config import Target, strategy_refusal
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.splits import exact_split, served_counts
from celeryops.ops.journal import CANCEL_CONSUMERS, OVERLAP_CUTOVER, OVERLAP_REVERT, OVERLAP_UP, Run
from celeryops.ops.run.recovery import RecoveryPlan

Split = tuple[tuple[str, int], ...]
Step = Literal["done", "nothing", "start", "wait_new", "drain_old", "cutover", "retire", "ask"]

ABORT = "celeryops abort"
RESUME = "celeryops resume"


@dataclass(frozen=True)
class Destination:
    """What the pool moves to: the revision ``revision``, made by the update from ``image`` (its name chosen up
    front), or, with ``image`` None, a revision that exists already (a rollback)."""

    revision: str
    image: str | None = None


@dataclass(frozen=True)
class Plan:
    """What an overlap deploy does to worker pool ``target``: from revision ``old`` (all its ``count`` instances)
    to ``new`` (named up front; ``image``: the image it is made with, None when it exists already, as a rollback's
    does), through ``count`` x 2 instances at the peak. ``split_before``: the split the pool asked for before.

    ``cohorts``: a pool whose instances are split between several revisions of celeryops' own cohorts (the
    autoscaler's: revisions of one image with exact counts) moves from all of them, each with its exact count
    (``old`` is the one with the most instances, ``count`` their total); empty: every instance runs ``old``."""

    target: str
    old: str
    new: str
    count: int
    image: str | None = None
    split_before: Split = ()
    beside: int = 0  # this many instances of ``new`` beside all ``count`` of ``old`` (0: as many, the overlap's)
    cohorts: Split = ()

    @property
    def olds(self) -> dict[str, int]:
        """The old revisions with the instances each runs: ``old`` alone with ``count``, or the cohorts."""
        return dict(self.cohorts) if self.cohorts else {self.old: self.count}

    @property
    def old_names(self) -> str:
        """The old revisions in words: ``a``, ``a and b``, ``a, b and c``."""
        names = list(self.olds)
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"

    @property
    def revisions(self) -> tuple[str, ...]:
        """Every revision of the plan: the old ones, then the new one."""
        return (*self.olds, self.new)

    @property
    def new_count(self) -> int:
        """The instances of the new revision while both run."""
        return self.beside or self.count

    @property
    def peak(self) -> int:
        """The instances this plan's scale-up asks for (both revisions side by side)."""
        return self.count + self.new_count

    @property
    def highest(self) -> int:
        """The most instances the run can reach: :attr:`peak`, or, a few instances beside the old ones, their
        promotion's (the overlap's peak)."""
        return run_peak(self.count, self.beside)

    @property
    def up_counts(self) -> dict[str, int]:
        """The instances of each revision while both run: all of the old ones' (each its own), ``new_count`` of
        the new."""
        return {**self.olds, self.new: self.new_count}

    @property
    def up_split(self) -> Split:
        """The old revisions keep all their instances at ``peak``: half each (the overlap), or exactly ``beside``
        instances of the new one (:func:`~celeryops.core.canary.canary_split`); cohorts: the exact split of
        :attr:`up_counts` (:func:`~celeryops.core.splits.exact_split`)."""
        if self.cohorts:
            return exact_split(self.up_counts)
        if self.beside:
            return canary_split(self.old, self.new, self.count, self.beside)
        return ((self.old, 50), (self.new, 50))

    @property
    def back_split(self) -> Split:
        """The split that puts every instance back on the old revisions, each its count (the retirement's)."""
        return exact_split(self.olds)

    def promoted(self) -> Plan:
        """A plan of a few new instances, promoted: the overlap's (as many new instances as old ones)."""
        return replace(self, beside=0)

    def payload(self, **extra: Any) -> dict[str, Any]:
        cohorts = {"cohorts": [list(e) for e in self.cohorts]} if self.cohorts else {}
        return {"target": self.target, "old_revision": self.old, "new_revision": self.new, "count": self.count,
                "image": self.image, "split_before": [list(e) for e in self.split_before], "peak": self.peak,
                "split": [list(e) for e in self.up_split], "canary": self.beside,  # the journal's key: kept
                **cohorts, **extra}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Plan:
        return cls(target=str(data.get("target", "")), old=str(data.get("old_revision", "")),
                   new=str(data.get("new_revision", "")), count=int(data.get("count") or 0),
                   image=str(data["image"]) if data.get("image") else None,
                   split_before=tuple((str(r), int(p)) for r, p in data.get("split_before") or ()),
                   beside=int(data.get("canary") or 0),
                   cohorts=tuple((str(r), int(n)) for r, n in data.get("cohorts") or ()))


@dataclass(frozen=True)
class PoolNow:
    """The worker pool as Cloud Run reports it now: still rolling out (``reconciling``), its instance ``count``,
    the split it serves (revision -> percent, the latest entry resolved) and its revisions' Ready states."""

    reconciling: bool
    count: int | None
    served: dict[str, int]
    revisions: dict[str, str] = field(default_factory=dict)

    def serves_exactly(self, counts: Mapping[str, int]) -> bool:
        """The pool runs exactly ``counts`` (revision -> instances), no other revision."""
        return served_counts(self.count or 0, self.served) == {r: n for r, n in counts.items() if n > 0}


def pool_now(state: RolloutState, revisions: Iterable[RevisionInfo]) -> PoolNow:
    return PoolNow(reconciling=state.reconciling, count=state.instance_count, served=state.served,
                   revisions={r.name: r.state for r in revisions})


@dataclass(frozen=True)
class Progress:
    """What an overlap run's journal says was done. ``up`` / ``cutover`` / ``revert``: the intent was written;
    ``*_settled``: None while unsettled, else whether it took effect (a revert settled False was given up: both
    revisions consume). ``old_stopped`` / ``new_stopped``: consumers each revision's workers were told to stop
    and not yet given back."""

    plan: Plan | None
    up_settled: bool | None = None
    old_stopped: dict[str, set[str]] = field(default_factory=dict)
    new_stopped: dict[str, set[str]] = field(default_factory=dict)
    cutover: bool = False
    revert: bool = False
    revert_settled: bool | None = None


def _settled(run: Run, seq: int) -> bool | None:
    record = run.settlement(seq)
    return None if record is None else bool(record.payload.get("ok", True))


def progress_of(run: Run) -> Progress:
    ups = run.intents(OVERLAP_UP)
    if not ups:
        return Progress(plan=None)
    plan = Plan.from_payload(ups[-1].payload)
    revision_of: dict[str, str] = {}
    for rec in run.intents(CANCEL_CONSUMERS):
        stop = rec.payload.get("stop")
        for worker in stop if isinstance(stop, Mapping) else ():
            revision_of[str(worker)] = str(rec.payload.get("revision") or plan.old)
    stopped = run.stopped_consumers()
    reverts = run.intents(OVERLAP_REVERT)
    return Progress(
        plan=plan, up_settled=_settled(run, ups[-1].seq),
        old_stopped={w: q for w, q in stopped.items() if revision_of.get(w, plan.old) != plan.new},
        new_stopped={w: q for w, q in stopped.items() if revision_of.get(w) == plan.new},
        cutover=bool(run.intents(OVERLAP_CUTOVER)),
        revert=bool(reverts), revert_settled=_settled(run, reverts[-1].seq) if reverts else None)


@dataclass(frozen=True)
class Decision:
    """What to do next (``step``) and one sentence saying why, for the operator."""

    step: Step
    explanation: str


def decide(run: Run, pool: PoolNow | None, *, resume: bool, denied: DeployError | None = None) -> Decision:
    """The next step of ``abort`` (``resume`` False) or ``resume`` for the overlap run ``run``, given the pool now
    (None: Cloud Run could not be asked; ``denied``: it refused for want of a permission, which the sentence names
    with its role: asking again changes nothing until it is granted)."""
    p = progress_of(run)
    if run.finished:
        return Decision("done", f"Run {run.id} already ended ({run.outcome or run.phase}): there is nothing to do.")
    if p.plan is None:
        if resume:
            return Decision("start", f"Run {run.id} never sent its worker pool update: it starts at the update.")
        return Decision("nothing", f"Run {run.id} was interrupted before it changed the worker pool: there is "
                                   "nothing to undo; it will be marked aborted.")
    plan = p.plan
    if pool is None and denied is not None:
        return Decision("ask", f"Run {run.id} changed worker pool {plan.target}, and celeryops may not read it or "
                               f"its revisions ({denied.permission} is missing), so it cannot tell how far the run got "
                               "and changed nothing on the pool (stopped consumers are given back): grant "
                               f"{denied.role or role_for(denied.permission)} to the account celeryops runs as, then "
                               f"run `{RESUME}` or `{ABORT}` again.")
    if pool is None:
        return Decision("ask", f"Run {run.id} changed worker pool {plan.target} and Cloud Run does not answer, so "
                               "nothing about the pool was decided (stopped consumers are given back): run "
                               f"`{RESUME}` or `{ABORT}` again when it answers.")
    # The phase cutting_over comes a moment before the cutover's intent (the fence is parked between them) and
    # never goes back: a run that stopped in between finishes the cutover too (the old revision drained again).
    if p.cutover or run.phase == "cutting_over":
        return Decision("cutover", f"Run {run.id} began moving every instance of {plan.target} to {plan.new} (the "
                                   f"old revision {plan.old_names} was idle): the cutover is finished, never undone.")
    if p.revert and p.revert_settled is None:
        return Decision("retire", f"Run {run.id} began retiring the new revision {plan.new}: the retirement is "
                                  f"finished (the pool goes back to {plan.count} instance(s) of {plan.old_names}).")
    took_effect = p.up_settled is True or pool.reconciling or (
        plan.new in pool.revisions if plan.image is not None  # a new revision: it exists once the update took
        else pool.count != plan.count or plan.new in pool.served)  # an existing one: the count or split changed
    if not took_effect:
        if resume:
            return Decision("start", f"The update of run {run.id} never took effect ({plan.new} does not exist): "
                                     "it is sent again.")
        return Decision("nothing", f"The update of run {run.id} never took effect ({plan.new} does not exist): "
                                   "there is nothing to undo; it will be marked aborted.")
    failed = p.up_settled is False or pool.revisions.get(plan.new) == "failed"
    if not resume:
        restore = f"the old revision {plan.old_names}'s consumers are restored, then " if p.old_stopped else ""
        return Decision("retire", f"Run {run.id} runs {plan.new} beside {plan.old_names}: {restore}the new revision is "
                                  f"retired (held, drained, then the pool goes back to {plan.count} instance(s) of "
                                  f"{plan.old_names}).")
    if failed:
        return Decision("retire", f"The new revision {plan.new} of run {run.id} failed to start: the deploy cannot "
                                  f"go on; it is retired and {plan.old_names} keeps serving.")
    if p.old_stopped:
        return Decision("drain_old", f"Run {run.id} stopped the old revision {plan.old_names}'s consumers: it is "
                                     f"drained again, then every instance moves to {plan.new}.")
    return Decision("wait_new", f"Run {run.id} runs {plan.new} beside {plan.old_names}: once the new revision's "
                                "workers consume, the old revision is stopped, drained and retired.")


def recovery_plan(run: Run) -> RecoveryPlan:
    """What ``abort`` would do, from the journal alone (``celeryops status``, the console's recovery panel): as if
    the pool update the journal records took effect (``abort`` asks Cloud Run first)."""
    decided = decide(run, PoolNow(reconciling=True, count=None, served={}), resume=False)
    stopped = stopped_map(progress_of(run).old_stopped)
    if decided.step in ("done", "nothing"):
        return RecoveryPlan("nothing", {}, decided.explanation, [] if run.finished else [ABORT],
                            None if run.finished else "aborted")
    if decided.step == "cutover":
        return RecoveryPlan("cutover", {}, decided.explanation, [RESUME, ABORT])
    what = "rollback" if run.kind == "rollback" else "deploy"
    return RecoveryPlan("retire", stopped, decided.explanation + f" (`{RESUME}` continues the {what} instead.)",
                        [ABORT, RESUME])


def stopped_map(stopped: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    return {w: sorted(q) for w, q in sorted(stopped.items())}


def describe_split(split: Mapping[str, int] | Sequence[tuple[str, int]]) -> str:
    pairs = split.items() if isinstance(split, Mapping) else split
    return ", ".join(f"{rev or 'latest'} {pct}%" for rev, pct in pairs if pct > 0) or "no revision"


def pool_target(targets: Sequence[Target], strategy: str, *, rollback: bool = False) -> Target:
    """The one worker pool a deploy or rollback of two revisions side by side (``strategy``: its name) moves; one
    sentence (exit 2) for anything else."""
    run, alone, other = (("rollback", "roll the worker pool back alone", "roll it back") if rollback else
                         ("deploy", "deploy the worker pool alone", "deploy it"))
    if len(targets) != 1:
        names = ", ".join(t.name for t in targets)
        article = "An" if strategy[0] in "aeiou" else "A"
        raise UserError(f"{article} {strategy} {run} moves one worker pool at a time and {len(targets)} targets "
                        f"were chosen ({names}): nothing was changed; {alone} with --target NAME (the others with "
                        "--strategy drain).", EXIT_USAGE)
    refusal = strategy_refusal(targets[0], strategy)
    if refusal:
        raise UserError(f"The {strategy} strategy is refused: {refusal}: nothing was changed; {other} with --strategy "
                        "drain.", EXIT_USAGE)
    return targets[0]


def one_revision(target: Target, split: Split, source: str) -> None:
    """A rollback of a pool moves every instance to one revision: one sentence (exit 2) when what it would go back to
    is a split of several (``source``: where the split came from, in words)."""
    if len(split) != 1:
        raise UserError(f"An overlap rollback moves every instance of {target.display} to one revision, and what it "
                        f"would go back to is a split ({describe_split(split)}, {source}): nothing was changed; name "
                        "one revision with --to REVISION, or roll back with --strategy drain.", EXIT_USAGE)
