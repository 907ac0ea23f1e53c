"""The preflight checks of an overlap deploy (a Cloud Run worker pool whose new revision runs beside the old one).

They replace the drain deploy's ``traffic``, ``validate`` and ``fence`` checks and add ``mixed_versions``:

- ``traffic``: every instance of the pool runs one revision (the old one), or celeryops' own cohorts (revisions of one
  image the autoscaler added, each with an exact count: told apart from a split pinned by hand by the caller), and
  the peak instance count the deploy reaches (twice the count: quota, cost);
- ``validate``: Cloud Run accepts the exact update that brings the new revision up (validate only);
- ``fence``: FAILS unless every known worker runs the fence plugin of this fleet and can be held by revision: the
  old revision's workers are told apart by it, and only they may stop;
- ``mixed_versions``: warns that old and new code consume the same queues for a while;
- ``revisions`` (:func:`revisions_check`, a rollback's too): FAILS unless the caller may read the pool's revisions
  (``run.revisions.get``, ``run.revisions.list``: roles/run.viewer or roles/run.developer), which every step and
  every recovery reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field

from celery import Celery

from celeryops.adapters.deploy.base import DeployError, PoolUpdate, RolloutState, role_for
from celeryops.core.autoscale import MAX_INSTANCES_LIMIT
from celeryops.core.canary import canary_split, run_peak
from celeryops.core.config import Target
from celeryops.core.splits import exact_split
from celeryops.ops.preflight.checks import MissingPermissions, permissions_check
from celeryops.ops.preflight.framework import Check, CheckResult, refusal

REVISION_SCOPE = "only_revisions"  # the fence plugin feature an overlap needs (celeryops.fence.record.FEATURES)


@dataclass(frozen=True)
class PoolView:
    """What the checks learn about the pool (read once for all of them): its state and, when its instances are split
    between celeryops' own cohorts, their exact counts (``cohorts``; empty otherwise)."""

    state: RolloutState
    cohorts: dict[str, int] = field(default_factory=dict)

    @property
    def served(self) -> dict[str, int]:
        return self.state.served

    @property
    def olds(self) -> dict[str, int]:
        """The revisions the deploy moves away from, each with its instances: the one that serves every instance,
        or the cohorts ({} when neither: a split pinned by hand)."""
        if self.cohorts:
            return dict(self.cohorts)
        return {next(iter(self.served)): self.count} if len(self.served) == 1 else {}

    @property
    def old(self) -> str:
        """The one revision that serves every instance, or the cohort with the most ("" when neither)."""
        olds = self.olds
        return max(olds, key=lambda rev: olds[rev]) if olds else ""

    @property
    def names(self) -> str:
        """The old revisions in words (the cohorts with their counts)."""
        if self.cohorts:
            return "celeryops' cohorts " + ", ".join(f"{rev} x{n}" for rev, n in self.cohorts.items())
        return self.old

    @property
    def count(self) -> int:
        return self.state.instance_count or 0


def overlap_checks(target: Target, read_pool: Callable[[], Awaitable[PoolView]],
                   validate: Callable[[PoolUpdate], Awaitable[None]], image: str, new_revision: str, *,
                   app: Celery, fleet: str, known: Callable[[], Awaitable[Collection[str]]],
                   has_registry: bool, rollback: bool = False,
                   revisions: MissingPermissions | None = None, canary: int = 0) -> list[Check]:
    """``read_pool``: the pool now (shared by the checks); ``validate``: sends an update with validate_only.
    ``rollback``: the checks of an overlap rollback (``new_revision`` exists already: the scale-up sets no image),
    told in its words. ``revisions``: the revision permissions the caller lacks (adds :func:`revisions_check`).
    ``canary``: a canary deploy's (that many instances of the new revision beside the old ones, not as many)."""
    flow, alternative = ("rollback", "roll back") if rollback else ("deploy", "deploy")
    old_one, new_one, idle = ("the deployed revision", "the previous one", "the deployed one") if rollback else \
        ("the old revision", "the new one", "the old one")

    def split_of(pool: PoolView) -> tuple[tuple[str, int], ...]:
        if pool.cohorts:
            return exact_split({**pool.cohorts, new_revision: canary or pool.count})
        if canary:
            return canary_split(pool.old, new_revision, pool.count, canary)
        return ((pool.old, 50), (new_revision, 50))

    async def traffic() -> CheckResult:
        pool = await read_pool()
        where = f"worker pool {target.resource}"
        if not pool.old:
            split = ", ".join(f"{rev} {pct}%" for rev, pct in pool.served.items())
            return CheckResult("traffic", "", "fail", f"the instances of {where} are split between revisions "
                               f"({split}) that are not celeryops' own cohorts (neither the fleet's journal nor its "
                               "autoscaler set that split): an overlap deploy starts from one revision, or from the "
                               "cohorts of celeryops autoscale",
                               "finish or undo the deploy that split them (`celeryops status`), or route all "
                               "instances to one revision in the Cloud console, then run preflight again")
        if new_revision in pool.cohorts:
            return CheckResult("traffic", "", "fail", f"{new_revision} already runs as one of celeryops' cohorts of "
                               f"{where}", f"name another revision to {alternative} to, or {alternative} with "
                               "--strategy drain")
        if pool.cohorts and run_peak(pool.count, canary) > MAX_INSTANCES_LIMIT:
            return CheckResult("traffic", "", "fail", f"{where} runs {pool.count} instances as celeryops' cohorts, "
                               f"and the {flow} would run {run_peak(pool.count, canary)} with them at the peak: exact "
                               f"counts for several revisions hold up to {MAX_INSTANCES_LIMIT} instances in all",
                               f"lower [autoscale] max_instances to {MAX_INSTANCES_LIMIT // 2} or less, or "
                               f"{alternative} with --strategy drain")
        if pool.count <= 0:
            return CheckResult("traffic", "", "fail", f"{where} runs no instance (manual_instance_count 0)",
                               f"give it instances (gcloud run worker-pools update {target.resource} --instances N) "
                               "and deploy again")
        unset = "" if pool.state.instance_count_set else (
            f"{where} sets no scaling.manual_instance_count, which Cloud Run runs as 1 instance: celeryops counts 1 "
            "and sets it to 1 explicitly at the cutover; ")
        judged = (f" ({pool.count + canary} instances while it is judged), as many as them if it is promoted"
                  if canary else "")  # the promotion runs the overlap's peak: the highest is named
        kept = " (each kept at its count until they are drained)" if pool.cohorts else ""
        return CheckResult("traffic", "", "ok", f"{unset}all {pool.count} instance(s) of {where} run {pool.names}"
                           f"{kept}; the "
                           f"{flow} runs {canary or pool.count} of {new_revision} beside them{judged}: "
                           f"{run_peak(pool.count, canary)} instances at the peak (quota, cost), then back to "
                           f"{pool.count}")

    async def validated() -> CheckResult:
        pool = await read_pool()
        if not pool.old or pool.count <= 0 or new_revision in pool.cohorts:
            return CheckResult("validate", "", "fail", "there is no update to validate (see the traffic check)",
                               "fix what the traffic check says, then run preflight again")
        change = PoolUpdate(image=None if rollback else image, revision="" if rollback else new_revision,
                            instance_count=pool.count + (canary or pool.count), split=split_of(pool))
        try:
            await validate(change)
        except DeployError as err:
            if err.permission:
                return CheckResult("validate", "", "fail", f"{target.name}: Cloud Run refused the update "
                                   f"(validate only): {err.permission} is missing",
                                   f"grant {err.role or role_for(err.permission)} to the account celeryops runs as, "
                                   "then run preflight again")
            said, todo = refusal(str(err))
            return CheckResult("validate", "", "fail", f"{target.name}: {said}", todo)
        return CheckResult("validate", "", "ok", f"Cloud Run accepted the update that runs {new_revision} beside "
                           f"{', '.join(pool.olds)} ({pool.count + (canary or pool.count)} instances, "
                           f"{'/'.join(str(p) for _, p in split_of(pool))}; validate only: nothing changed)")

    async def fence() -> CheckResult:
        from celeryops.fence import fence_status

        if not has_registry:
            return CheckResult("fence", "", "fail", "no Redis holds the fleet's fence and its registry (the broker "
                               "is not Redis), so the old revision's workers cannot be held apart from the new ones",
                               "set CELERYOPS_REDIS_URL to the Redis the workers' fence plugin uses, or "
                               f"{alternative} with --strategy drain")
        pool = await read_pool()
        destination = sorted(await known())
        replies = await asyncio.to_thread(fence_status, app, destination or None)
        if not replies:
            return CheckResult("fence", "", "fail", "no worker answered the fence status command",
                               "check the workers, then run preflight again")
        problems: list[str] = []
        without = sorted(w for w, r in replies.items() if not r.plugin)
        if without:
            problems.append(f"{len(without)} worker(s) run without the fence plugin: {_names(without)}")
        elsewhere = sorted(w for w, r in replies.items() if r.plugin and r.fleet and r.fleet != fleet)
        if elsewhere:
            problems.append(f"{len(elsewhere)} worker(s) follow another fleet's fence: {_names(elsewhere)}")
        old_plugin = sorted(w for w, r in replies.items() if r.plugin and REVISION_SCOPE not in r.features)
        if old_plugin:
            problems.append(f"{len(old_plugin)} worker(s) run a fence plugin too old to be held by revision: "
                            f"{_names(old_plugin)}")
        no_revision = sorted(w for w, r in replies.items() if r.plugin and not r.revision)
        if no_revision:
            problems.append(f"{len(no_revision)} worker(s) report no Cloud Run revision: {_names(no_revision)}")
        if problems:
            return CheckResult("fence", "", "fail", "; ".join(problems) + f": an overlap {flow} tells {old_one}'s "
                               "workers apart by their fence plugin, and stops only them",
                               "install celeryops.fence (this version) in the worker app of every worker, with the "
                               f"fleet's CELERYOPS_FLEET, or {alternative} with --strategy drain")
        olds = pool.olds
        old = sorted(w for w, r in replies.items() if r.revision in olds)
        if olds and not old:
            return CheckResult("fence", "", "fail", f"no worker of revision {', '.join(olds)} answered, so the old "
                               "revision's workers are not known", "check the pool's workers (their logs), then run "
                               "preflight again")
        others = sorted({r.revision for r in replies.values() if r.revision not in olds})
        rest = f"; workers of {', '.join(others)} are not touched" if others else ""
        return CheckResult("fence", "", "ok", f"all {len(replies)} worker(s) run the fence plugin and report their "
                           f"revision: {len(old)} of {', '.join(olds) or 'the old revision'} will be held{rest}")

    async def mixed() -> CheckResult:
        pool = await read_pool()
        olds = ", ".join(pool.olds) or "(unknown)"
        return CheckResult("mixed_versions", "", "warn", f"{old_one} {olds} and {new_one} "
                           f"({image}) consume the same queues side by side until {idle} is idle: a task "
                           "sent by either version may run on the other",
                           f"keep task names and arguments compatible both ways for this {flow} (new arguments "
                           "optional, none removed), accept with --accept-warning mixed_versions, or "
                           f"{alternative} with --strategy drain")

    checks = [Check("traffic", "Instances on one revision (peak shown)", traffic, timeout=30),
              Check("validate", "Cloud Run accepts the scale-up", validated, timeout=30),
              Check("fence", "Fence plugin on every worker (required)", fence, timeout=20),
              Check("mixed_versions", "Old and new code side by side", mixed, timeout=30)]
    return checks + ([revisions_check([(target.name, revisions)])] if revisions is not None else [])


def revisions_check(targets: list[tuple[str, MissingPermissions]]) -> Check:
    """``revisions``: fails unless the caller may read each target's revisions (``run.revisions.get`` and
    ``run.revisions.list``), naming the role that grants them: an overlap deploy and a rollback read them at every
    step, and their recovery decides from them."""
    return permissions_check(targets, check_id="revisions", title="Revisions readable (run.revisions.get/list)")


def _names(names: list[str], limit: int = 4) -> str:
    return ", ".join(names[:limit]) + ("..." if len(names) > limit else "")
