"""What a rollback goes back to, decided before anything is touched: per target, the split its last deploy replaced
(from the run journal) or the revision named with ``--to``, checked against the revisions Cloud Run has. No I/O but
reading the journal handed in; every refusal is one sentence (:class:`~celeryops.core.errors.UserError`, exit 2).

The journal read is the one the fleet holds (its Redis copy: any machine's deploys, a CI runner's too) as well as this
machine's. The journal records, for every deploy, the target's state before it (the ``deploy_start`` intent's
``previous``; an overlap deploy's ``overlap_up`` intent's ``before``): what served then (``traffic_statuses``: a split,
usually one revision at 100%) is what the deploy replaced. Only
deploys that took effect count, and only deploys: a rollback's own routes do not, so rolling back twice leaves the
target where the first rollback left it (say ``--to`` to go elsewhere). What serves now is checked against what that
deploy left (:func:`changed_since`): a deploy since then that the journal does not know stops the rollback before
anything changes, asking for ``--to``: never a silent two steps back."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celeryops.adapters.deploy.base import RevisionInfo, RolloutState, describe_split, short_revision
from celeryops.core.config import DEFAULT_STRATEGY, Config, Target
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.ops.journal import DEPLOY_START, OVERLAP_CUTOVER, OVERLAP_UP, Journal, Record, Run, UnknownRun
from celeryops.ops.run.pool.rules import Plan

Split = tuple[tuple[str, int], ...]
HISTORY_DEPTH = 200  # how many of the fleet's latest runs are searched for a target's last deploy


@dataclass(frozen=True)
class RollbackRequest:
    """What the operator asked for: ``targets`` (empty: every configured one, or the run's), ``to`` (``--to``: one
    target's revision), ``strategy`` (``--strategy``; empty: each target's ``strategy``, else drain) and ``run_id``
    (the console's B on a deployed run: undo that deploy rather than each target's last one)."""

    targets: tuple[Target, ...] = ()
    to: str = ""
    strategy: str = ""
    run_id: str = ""


@dataclass(frozen=True)
class RollbackStep:
    """One target's way back: ``split`` is what will serve (``(short revision, percent)``), ``serving`` what serves
    now, ``image`` the image of the revision with the largest share, ``source`` where the split came from (in
    words), ``strategy`` how it is brought to serve."""

    target: Target
    split: Split
    serving: Split = ()
    image: str = ""
    source: str = ""
    strategy: str = DEFAULT_STRATEGY

    @property
    def revision(self) -> str:
        """The revision that gets the largest share (usually all of it)."""
        return max(self.split, key=lambda entry: entry[1])[0] if self.split else ""

    @property
    def was(self) -> str:
        """What served the largest share before the rollback."""
        return self.serving[0][0] if self.serving else ""

    def line(self) -> str:
        """``worker: worker-00002-def -> worker-00001-abc``, for confirmations and the stage's detail."""
        now = describe_split(self.serving) if self.serving else "?"
        return f"{self.target.name}: {now} -> {describe_split(self.split)}"


def strategy_of(request: RollbackRequest, target: Target) -> str:
    """The name of the strategy that rolls ``target`` back: the flag wins, then the target's ``strategy``."""
    return request.strategy or target.strategy or DEFAULT_STRATEGY


def chosen_targets(config: Config, request: RollbackRequest, journal: Journal | None) -> tuple[Target, ...]:
    """The targets to roll back, checked without touching anything: Cloud Run targets only, ``--to`` for one of
    them (what their strategy can move is the strategy's to say: ``celeryops.ops.run.rollback.chosen``). With
    ``run_id`` and no targets: the targets that run deployed to."""
    if not config.targets:
        raise UserError("No deploy target is configured, so there is nothing to roll back: nothing was changed; add a "
                        "[[targets]] table to celeryops.toml (see the README).", EXIT_USAGE)
    targets = request.targets
    if not targets and request.run_id and journal is not None:
        run = deploy_run(journal, request.run_id)
        names = list(dict.fromkeys(str(r.payload.get("target")) for r in starts(run)))
        targets = tuple(config.target(name) for name in names)
    targets = targets or config.targets
    commands = [t.name for t in targets if not t.is_cloudrun]
    if commands:
        which = ", ".join(repr(n) for n in commands)
        more = "" if request.targets else ", and name the Cloud Run targets with --target"
        raise UserError(f"Target {which} runs a command: celeryops can route only Cloud Run services and worker pools "
                        f"back to a revision they ran before, so nothing was changed; roll it back with its own "
                        f"command{more}.", EXIT_USAGE)
    if request.to and len(targets) != 1:
        raise UserError(f"--to names a revision of one target, and this rollback has {len(targets)} "
                        f"({', '.join(t.name for t in targets)}): nothing was changed; add --target NAME.", EXIT_USAGE)
    return targets


def deploy_run(journal: Journal, run_id: str) -> Run:
    """The run ``run_id``, which must be a deploy."""
    try:
        run = journal.get(run_id)
    except UnknownRun:
        raise UserError(f"There is no run {run_id!r} in the journal {journal.path}: nothing was changed; pick a "
                        "deployed run from `celeryops runs`.", EXIT_USAGE) from None
    if run.kind != "deploy" or not starts(run):
        raise UserError(f"Run {run_id} is a {run.kind} run that deployed nothing, so it cannot be rolled back: "
                        "nothing was changed; pick a deployed run.", EXIT_USAGE)
    return run


def starts(run: Run) -> list[Record]:
    """The records that started a deploy of a target, in order: ``deploy_start`` intents (a drain deploy's) and
    ``overlap_up`` intents (an overlap deploy's, which names the target and what served before)."""
    return [r for r in run.records if r.kind == "intent" and r.intent in (DEPLOY_START, OVERLAP_UP)]


def took_effect(run: Run, start: Record) -> bool:
    """The deploy this intent started took effect: settled ok, or the run went on to deployed / done. An overlap
    deploy: once its cutover took effect (the run went on to deployed / done, or the cutover settled ok); a new
    revision retired again never served alone."""
    if start.intent == OVERLAP_UP:
        cutovers = run.intents(OVERLAP_CUTOVER)
        return run.phase in ("deployed", "done") or any(
            (settled := run.settlement(c.seq)) is not None and settled.payload.get("ok", True) for c in cutovers)
    settled = run.settlement(start.seq)
    if settled is not None:
        return bool(settled.payload.get("ok", True))
    return run.phase in ("deployed", "done")


def last_deploy(journal: Journal, fleet: str, target: str, run_id: str = "") -> tuple[Run, Record] | None:
    """The latest deploy of ``target`` that took effect (of run ``run_id`` only, when given), with the intent that
    started it (:func:`starts`); None when the journal has none. Read from the journal the fleet holds (any
    machine's deploys: a CI runner's too) as well as this machine's."""
    runs: Iterable[Run] = [deploy_run(journal, run_id)] if run_id else journal.fleet_history(HISTORY_DEPTH, fleet)
    for run in runs:
        if run.kind != "deploy":
            continue  # a rollback's own routes are not deploys: rolling back twice stays put
        # The run's first start of the target that took effect: what served before the run (a canary's promotion is
        # a later ``overlap_up`` of the same run, which names no ``before``: the canary's own scale-up does).
        for start in starts(run):
            if start.payload.get("target") == target and took_effect(run, start):
                return run, start
    return None


def replaced(run: Run) -> dict[str, Split]:
    """What ``run`` replaced on each target it deployed to (the deploys that took effect), as the split that served
    before it: what a rollback of it goes back to, for every strategy alike (the run history shows it)."""
    found: dict[str, Split] = {}
    if run.kind != "deploy":
        return found
    for start in starts(run):
        target = str(start.payload.get("target") or "")
        if target and target not in found and took_effect(run, start) and (split := replaced_by(start)):
            found[target] = split
    return found


@dataclass(frozen=True)
class Recorded:
    """The last deploy of a target as the fleet's journal records it: ``replaced`` (the split that served before
    it), ``source`` (in words), and what it left serving: ``left`` (its revision at 100%; empty when the record does
    not name it) and ``image``."""

    replaced: Split
    source: str
    left: Split = ()
    image: str = ""
    run: str = ""


def replaced_split(config: Config, journal: Journal, target: Target, run_id: str = "") -> tuple[Split, str]:
    """What the last deploy of ``target`` replaced, as the split that served then, and where it came from."""
    found = recorded_deploy(config, journal, target, run_id)
    return found.replaced, found.source


def recorded_deploy(config: Config, journal: Journal, target: Target, run_id: str = "") -> Recorded:
    """The last deploy of ``target`` (:class:`Recorded`): what it replaced, and what it left serving."""
    found = last_deploy(journal, config.run.fleet, target.name, run_id)
    if found is None:
        where = f"run {run_id}" if run_id else f"the journal {journal.path}"
        raise UserError(f"{where[:1].upper()}{where[1:]} has no deploy of target {target.name!r} that took effect, so "
                        "there is no revision to go back to: nothing was changed; name one with --to REVISION (its "
                        f"revisions: {target.console_url or target.display}).", EXIT_USAGE)
    run, start = found
    split = replaced_by(start)
    if not split:
        raise UserError(f"The deploy of run {run.id} created the first revision of {target.display}, so there is no "
                        "revision before it: nothing was changed; name one with --to REVISION.", EXIT_USAGE)
    release = f", release {run.release}" if run.release else ""
    return Recorded(split, f"replaced by run {run.id}{release}", *left_by(run, start), run=run.id)


def left_by(run: Run, start: Record) -> tuple[Split, str]:
    """What the deploy ``start`` began left serving: its revision at 100% (a pool deploy's new revision, as its last
    ``overlap_up`` names it; a drain deploy's settled revision; empty when not recorded) and its image."""
    image = str(start.payload.get("image") or "")
    if start.intent == OVERLAP_UP:
        plan = Plan.from_payload(run.intents(OVERLAP_UP)[-1].payload)
        return ((plan.new, 100),) if plan.new else (), plan.image or image
    settled = run.settlement(start.seq)
    revision = str(settled.payload.get("revision") or "") if settled is not None else ""
    return (((short_revision(revision), 100),) if revision else ()), image


def changed_since(target: Target, recorded: Recorded, now: RolloutState,
                  revisions: Sequence[RevisionInfo]) -> None:
    """Refuse (one sentence, exit 2, nothing changed) when what serves now is neither what the recorded deploy left
    nor what it replaced (a rollback already done): a deploy since then that the fleet's journal does not know (CI
    without celeryops, gcloud, the Cloud console) would be skipped by going back to what the recorded one replaced."""
    serving = dict(now.served_split)
    if not serving or serving == dict(recorded.replaced):
        return
    images = {r.name: r.image for r in revisions}
    if recorded.left:
        # ... or cohorts of the image it left, which celeryops autoscale added beside it since.
        if serving == dict(recorded.left) or (recorded.image and all(
                images.get(rev) == recorded.image for rev in serving)):
            return
    else:
        main = now.served_split[0][0]
        if not recorded.image or images.get(main, recorded.image) == recorded.image:
            return
    left = describe_split(recorded.left) if recorded.left else f"the image {recorded.image}"
    raise UserError(f"{target.display} serves {describe_split(now.served_split)}, not {left} that run "
                    f"{recorded.run} left, so it was changed since by a deploy celeryops did not record (CI, gcloud or "
                    f"the Cloud console) and going back to {describe_split(recorded.replaced)} could skip it: nothing "
                    "was changed; name the revision to go back to with --to REVISION.", EXIT_USAGE)


def replaced_by(start: Record) -> Split:
    """What served the target when ``start`` began deploying it (its revisions by name, largest share first). A
    deploy from celeryops' own cohorts (revisions of one image the autoscaler added) replaced that image: the cohort
    with the most instances stands for it (going back to it runs that image on every instance)."""
    if start.intent == OVERLAP_UP:
        plan = Plan.from_payload(start.payload)
        if plan.cohorts:
            return ((plan.old, 100),)
        before = start.payload.get("before") or {}
        served = before.get("served") if isinstance(before, Mapping) else None
        pairs = [(str(rev), int(pct)) for rev, pct in (served or {}).items() if rev and int(pct) > 0]
        return tuple(sorted(pairs, key=lambda entry: (-entry[1], entry[0])))
    state = RolloutState.from_dict(dict(start.payload.get("previous") or {}))
    return tuple((rev, pct) for rev, pct in state.served_split if rev)


def checked_step(target: Target, split: Split, source: str, now: RolloutState, revisions: Sequence[RevisionInfo],
                 strategy: str, refuse: Callable[[RollbackStep], None] | None = None) -> RollbackStep:
    """The step for ``target``, once ``refuse`` (the strategy's ``check_rollback``: a way back it cannot take) said
    nothing, and every revision of ``split`` exists and Cloud Run can serve it (Ready)."""
    known = {r.name: r for r in revisions}
    serving = now.served_split
    if refuse is not None:
        refuse(RollbackStep(target, split, serving, "", source, strategy))
    for rev, _pct in split:
        info = known.get(rev)
        if info is not None and info.state == "succeeded":
            continue
        ready = [r.name for r in revisions if r.state == "succeeded" and r.name not in dict(serving)][:4]
        pick = (f"name a ready one with --to REVISION ({', '.join(ready)})" if ready
                else "it has no other ready revision to go back to")
        if info is None:
            why = f" (it was deleted since: {source})" if source.startswith("replaced") else ""
            raise UserError(f"Revision {rev} of {target.display} does not exist{why}: nothing was changed; {pick}.",
                            EXIT_USAGE)
        reason = ", ".join(part for part in (info.reason, info.message) if part)
        raise UserError(f"Revision {rev} of {target.display} cannot serve: Cloud Run reports it "
                        f"{info.state or 'not ready'}{f' ({reason})' if reason else ''}: nothing was changed; {pick}.",
                        EXIT_USAGE)
    main = max(split, key=lambda entry: entry[1])[0]
    return RollbackStep(target, split, serving, known[main].image, source, strategy)


def settings_of(steps: Sequence[RollbackStep], strategy: str) -> dict[str, Any]:
    """What the run journal keeps of a rollback (its settings), enough to resume it on any machine."""
    return {"kind": "rollback", "strategy": strategy, "targets": [s.target.name for s in steps],
            "rollback": {s.target.name: {"split": [list(e) for e in s.split], "serving": [list(e) for e in s.serving],
                                         "image": s.image, "source": s.source} for s in steps}}


def steps_of(config: Config, settings: Mapping[str, Any]) -> tuple[RollbackStep, ...]:
    """The steps a rollback run recorded (:func:`settings_of`), for ``resume``."""
    saved = settings.get("rollback") or {}
    steps = []
    for name in settings.get("targets") or ():
        entry = saved.get(name) or {}
        steps.append(RollbackStep(config.target(str(name)), _split(entry.get("split")), _split(entry.get("serving")),
                                  str(entry.get("image", "")), str(entry.get("source", "")),
                                  str(settings.get("strategy") or DEFAULT_STRATEGY)))
    return tuple(steps)


def _split(value: object) -> Split:
    if not isinstance(value, list | tuple):
        return ()
    return tuple((str(rev), int(pct)) for rev, pct in value)


def label_of(steps: Sequence[RollbackStep]) -> str:
    """The run's ``release`` field for a rollback: the revisions it goes back to (what ``runs`` lists)."""
    return ", ".join(dict.fromkeys(s.revision for s in steps))
