"""The deploy preflight checks that need git, the image registry, IAM and Cloud Run.

Each function returns a ``Check`` (see ``framework``); the git/image/freshness/permission checks take plain
parameters (the caller expands image templates and picks targets), the Cloud Run ones take (target, deployer)
pairs. Every result's detail is one line and every remedy says what to do.

1. ``release_branch_check``: the branch exists on the remote, its commit resolves, the checkout matches (else warn).
2. ``image_check``: the already-expanded image reference(s) exist in their registry.
3. ``freshness_check``: the branch tip is not older than ``max_age_days`` (else warn, with the age in words).
4. ``permissions_check``: per target, an async callable lists missing permissions; any missing -> fail, naming
   the role that grants each.
5. ``traffic_check``: no Cloud Run target's traffic / instance split pins older revisions (unless the target
   routes everything to the new revision with ``traffic = "latest"``, or the split is the one a celeryops rollback
   left, which the deploy moves on the same way); warns about a service's tagged revisions that keep old instances
   running at 0% (revision-level min instances).
6. ``validate_check``: Cloud Run accepts the exact update (sent with ``validate_only``; nothing changes), so a
   refusal such as a missing actAs is found before a consumer is stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from datetime import UTC, datetime, timedelta

import humanize
from celery import Celery

from celeryops.adapters.deploy.base import (
    Deployer,
    DeployError,
    RevisionInfo,
    RolloutState,
    describe_split,
    role_for,
    short_revision,
)
from celeryops.adapters.gitrepo import GitRepo
from celeryops.adapters.registry import ImageRegistry, ManifestProbe
from celeryops.core.config import Target
from celeryops.ops.preflight.framework import Check, CheckResult, one_line, refusal

MissingPermissions = Callable[[], Awaitable[Sequence[str]]]
Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def release_branch_check(
    repo: GitRepo, remote: str, branch: str, *, check_id: str = "branch", title: str = "Release branch"
) -> Check:
    """ok: ``remote/branch`` resolves and the local branch (or HEAD if there is none) is at the same commit;
    warn: the checkout differs (ahead/behind/diverged is shown); fail: no such branch, remote or repository."""
    remote_name = f"{remote}/{branch}"

    async def run() -> CheckResult:
        sha = await repo.ls_remote(remote, branch)
        if sha is None:
            return CheckResult(
                check_id, title, "fail", f"remote {remote} has no branch {branch!r}",
                f"push the {branch} branch to {remote} or correct the branch name, then run preflight again",
            )
        await repo.ensure_commit(sha, remote, branch)
        subject = await repo.commit_subject(sha)
        at = f"{remote_name} is at {sha[:12]}" + (f" ({subject})" if subject else "")
        local_sha = await repo.local_tip(branch)
        local_name = f"local {branch}"
        if local_sha is None:
            local_sha, local_name = await repo.local_tip(None), "local HEAD"
        if local_sha is None:
            return CheckResult(
                check_id, title, "warn", f"{at}; the local checkout has no commits to compare with",
                f"the deploy uses {remote_name}; check out {branch} (git switch {branch}) to review what ships",
            )
        if local_sha == sha:
            return CheckResult(check_id, title, "ok", f"{at}; {local_name} matches")
        diff = await repo.divergence(local_sha, sha, remote, branch)
        return CheckResult(
            check_id, title, "warn",
            f"{at}; {diff.describe(f'{local_name} ({local_sha[:12]})', remote_name)}",
            f"the deploy ships {remote_name}, not your checkout: pull or push {branch} if that is not what you want, "
            "or accept the warning",
        )

    return Check(check_id, title, run)


def image_check(
    image_refs: str | Sequence[str], registry: ImageRegistry | None = None, *, check_id: str = "image",
    title: str = "Image",
) -> Check:
    """ok: every image reference has a manifest; fail: any is missing, refused or unreachable (all are named)."""
    refs = [image_refs] if isinstance(image_refs, str) else list(dict.fromkeys(image_refs))
    client = registry or ImageRegistry()

    async def run() -> CheckResult:
        if not refs:
            return CheckResult(check_id, title, "fail", "no image reference to check",
                               "configure the image of each deploy target, then run preflight again")
        probes: list[ManifestProbe] = list(await asyncio.gather(*(client.probe(r) for r in refs)))
        bad = [p for p in probes if not p.exists]
        if not bad:
            if len(probes) == 1:
                return CheckResult(check_id, title, "ok", probes[0].detail)
            return CheckResult(check_id, title, "ok", f"all {len(probes)} images exist: {', '.join(refs)}")
        remedies = list(dict.fromkeys(p.remedy for p in bad if p.remedy))
        return CheckResult(check_id, title, "fail", "; ".join(p.detail for p in bad), "; ".join(remedies))

    return Check(check_id, title, run)


def freshness_check(
    repo: GitRepo, remote: str, branch: str, max_age_days: float, *, sha: str | None = None,
    now: Clock = _utcnow, check_id: str = "freshness", title: str = "Commit age",
) -> Check:
    """ok: the tip of ``remote/branch`` (or ``sha``) is at most ``max_age_days`` old; warn: older (age in words)."""
    limit = timedelta(days=max_age_days)
    limit_words = f"{max_age_days:g}-day"

    async def run() -> CheckResult:
        tip = sha or await repo.ls_remote(remote, branch)
        if tip is None:
            return CheckResult(
                check_id, title, "fail", f"remote {remote} has no branch {branch!r}, so its age is unknown",
                f"push the {branch} branch to {remote} or correct the branch name, then run preflight again",
            )
        committed = await repo.commit_time(tip, remote, branch)
        age = max(now() - committed, timedelta(0))
        words = humanize.naturaldelta(age)
        where = f"commit {tip[:12]} of {remote}/{branch} was committed {words} ago ({committed:%Y-%m-%d %H:%M} UTC)"
        if age > limit:
            return CheckResult(
                check_id, title, "warn", f"{where}, longer ago than the {limit_words} limit",
                f"make sure this old commit is what you mean to ship (merge the latest changes into {branch} if not), "
                "or accept the warning",
            )
        return CheckResult(check_id, title, "ok", f"{where}, within the {limit_words} limit")

    return Check(check_id, title, run)


def permissions_check(
    targets: Sequence[tuple[str, MissingPermissions]], *, check_id: str = "permissions", title: str = "Permissions"
) -> Check:
    """ok: no target misses a permission; fail: names each target's missing permissions (or why it was unknown)."""
    pairs = list(targets)

    async def run() -> CheckResult:
        if not pairs:
            return CheckResult(check_id, title, "ok", "no deploy target to check")
        outcomes = await asyncio.gather(*(missing() for _name, missing in pairs), return_exceptions=True)
        problems: list[str] = []
        roles: dict[str, list[str]] = {}
        errors = False
        for (name, _missing), outcome in zip(pairs, outcomes, strict=True):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            if isinstance(outcome, BaseException):
                errors = True
                reason = getattr(outcome, "detail", None) or str(outcome) or type(outcome).__name__
                problems.append(f"{name}: permissions could not be read ({one_line(str(reason))})")
            elif outcome:
                problems.append(f"{name} is missing {', '.join(sorted(outcome))}")
                for permission in sorted(outcome):
                    roles.setdefault(role_for(permission), []).append(permission)
        if not problems:
            names = ", ".join(name for name, _ in pairs)
            return CheckResult(check_id, title, "ok", f"every needed permission is granted on {names}")
        if roles:
            grants = "; ".join(f"{role} (for {', '.join(dict.fromkeys(perms))})" for role, perms in roles.items())
            grant = f"grant the account celeryops runs as {grants}"
        else:
            grant = ("grant the account celeryops runs as roles/run.developer, and roles/iam.serviceAccountUser on "
                     "the runtime service account")
        if errors:
            remedy = f"check your Google credentials and the target names, {grant}, then run preflight again"
        else:
            remedy = f"{grant}, then run preflight again"
        return CheckResult(check_id, title, "fail", "; ".join(problems), remedy)

    return Check(check_id, title, run)


def fence_plugin_check(app: Celery, fleet: str, *, check_id: str = "fence", title: str = "Drain fence plugin",
                       known: Callable[[], Awaitable[Collection[str]]] | None = None) -> Check:
    """ok: every worker that answers runs the drain fence plugin of ``fleet``; warn: some don't (listed), or none
    answered; fail: plugin workers follow another fleet's fence (the run's fence and lease would not be theirs)."""

    async def run() -> CheckResult:
        from celeryops.fence import fence_status

        # Addressed to the known workers, the broadcast returns as soon as each replied (not after its timeout).
        destination = sorted(await known()) if known is not None else None
        replies = await asyncio.to_thread(fence_status, app, destination or None)
        elsewhere = sorted((r.fleet, w) for w, r in replies.items() if r.plugin and r.fleet and r.fleet != fleet)
        if elsewhere:
            names = sorted({f for f, _ in elsewhere})
            return CheckResult(check_id, title, "fail",
                               f"{len(elsewhere)} worker(s) follow the fence of fleet {', '.join(map(repr, names))}, "
                               f"not {fleet!r}: {', '.join(w for _, w in elsewhere[:4])}"
                               + ("..." if len(elsewhere) > 4 else ""),
                               f"set CELERYOPS_FLEET={names[0]} here (or fix the workers' CELERYOPS_FLEET) so that "
                               "the fence, the run lease and watchers all name the same fleet")
        if not replies:
            return CheckResult(check_id, title, "warn", "no worker answered the fence status command",
                               "check the workers; the drain still re-broadcasts the stop at every poll")
        without = sorted(w for w, r in replies.items() if not r.plugin)
        if without:
            return CheckResult(check_id, title, "warn",
                               f"{len(without)} of {len(replies)} worker(s) run without the fence plugin: "
                               f"{', '.join(without[:6])}" + ("..." if len(without) > 6 else ""),
                               "install celeryops.fence in the worker app; until then the re-broadcast stops them")
        return CheckResult(check_id, title, "ok", f"all {len(replies)} worker(s) run the fence plugin")

    return Check(check_id, title, run, timeout=15)


TargetDeployer = tuple[Target, Deployer]


def traffic_check(pairs: Sequence[TargetDeployer], *, check_id: str = "traffic",
                  title: str = "Traffic to the new revision") -> Check:
    """ok: every Cloud Run target sends all traffic (worker pools: all instances) to its latest revision, or routes
    it there in the deploy's own update (``traffic = "latest"``); fail: a split pins older revisions (a rollback in
    the console), so the new revision would get only what is left while the deploy reported success."""
    chosen = [(t, d) for t, d in pairs if t.is_cloudrun]

    async def run() -> CheckResult:
        if not chosen:
            return CheckResult(check_id, title, "ok", "no Cloud Run target")
        states = await asyncio.gather(*(d.current(t) for t, d in chosen), return_exceptions=True)
        pinned: list[str] = []
        routed: list[str] = []
        unread: list[str] = []
        ours = False  # a split a celeryops rollback left is among the routed ones
        kept: list[str] = []
        for (target, deployer), state in zip(chosen, states, strict=True):
            if isinstance(state, asyncio.CancelledError):
                raise state
            if isinstance(state, BaseException):
                unread.append(f"{target.name}: {one_line(str(state))}")
                continue
            kept += await _kept_by_tags(target, deployer, state)
            if not state.pinned:
                continue
            what = "instances" if target.kind == "cloudrun-worker-pool" else "traffic"
            split = f"{target.name} pins {what} to {describe_split(state.traffic, state.latest_ready_revision)}"
            if state.owned and target.traffic != "latest":  # a celeryops rollback left it: ours to move on
                split += " (left by a celeryops rollback)"
                ours = True
            (routed if target.traffic == "latest" or state.owned else pinned).append(split)
        if unread:
            return CheckResult(check_id, title, "fail", "; ".join(unread),
                               "fix what the message says, then run preflight again")
        if pinned:
            names = [p.split(" ", 1)[0] for p in pinned]
            return CheckResult(check_id, title, "fail",
                               "; ".join(pinned) + ": every update keeps that split, so the new revision would "
                               "get only the unpinned share while the deploy looked successful",
                               f"set traffic = \"latest\" on target(s) {', '.join(names)} to route everything to the "
                               "new revision in the same update, or send all traffic to the latest revision in the "
                               "Cloud console, then run preflight again")
        if kept:
            return CheckResult(check_id, title, "warn", "; ".join(kept) + ": their workers keep consuming with the "
                               "old code after the deploy",
                               "remove the tag (gcloud run services update-traffic SERVICE --remove-tags TAG) or that "
                               "revision's min instances, then run preflight again; or accept with --accept-warning "
                               "traffic")
        if routed:
            why = "" if ours else " (traffic = \"latest\")"
            return CheckResult(check_id, title, "ok", "; ".join(routed) + "; the deploy routes everything to the new "
                               f"revision{why}")
        every = ", ".join(t.name for t, _ in chosen)
        return CheckResult(check_id, title, "ok", f"all traffic goes to the latest revision on {every}")

    return Check(check_id, title, run)


async def _kept_by_tags(target: Target, deployer: Deployer, state: RolloutState) -> list[str]:
    """A service's tagged revisions (other than the latest) that Cloud Run keeps running at 0% of the traffic
    (revision-level min instances), each named with its tag and instance count."""
    listing = getattr(deployer, "revisions", None)
    if target.kind != "cloudrun-service" or not state.tagged or listing is None:
        return []
    latest = short_revision(state.latest_ready_revision)
    tags = {rev: tag for tag, rev in state.tagged if rev != latest}
    revisions: list[RevisionInfo] = await listing(target)
    return [f"{target.name}: tag {tags[r.name]!r} keeps revision {r.name} running "
            f"{max(r.instances, r.min_instances)} instance(s) at 0% of the traffic (revision-level min instances)"
            for r in revisions if r.name in tags and max(r.instances, r.min_instances) > 0]


def validate_check(pairs: Sequence[tuple[Target, Deployer, str]], *, check_id: str = "validate",
                   title: str = "Cloud Run accepts the update") -> Check:
    """ok: Cloud Run accepted each target's exact update, sent with ``validate_only`` (nothing changed); fail: it
    refused one (a missing actAs on the runtime service account, a bad image reference, a busy service ...), named
    with the role that grants a missing permission."""
    chosen = [(t, d, image) for t, d, image in pairs if t.is_cloudrun]

    async def run() -> CheckResult:
        if not chosen:
            return CheckResult(check_id, title, "ok", "no Cloud Run target")
        outcomes = await asyncio.gather(*(d.validate(t, image) for t, d, image in chosen), return_exceptions=True)
        problems: list[str] = []
        remedies: list[str] = []
        for (target, _d, _image), outcome in zip(chosen, outcomes, strict=True):
            if isinstance(outcome, asyncio.CancelledError):
                raise outcome
            if isinstance(outcome, DeployError) and outcome.permission:
                problems.append(f"{target.name}: Cloud Run refused the update (validate only): "
                                f"{outcome.permission} is missing")
                remedies.append(f"grant {outcome.role or role_for(outcome.permission)} to the account celeryops "
                                "runs as, then run preflight again")
            elif isinstance(outcome, BaseException):
                said, todo = refusal(str(outcome))
                problems.append(f"{target.name}: {said}")
                remedies.append(todo)
        if problems:
            return CheckResult(check_id, title, "fail", "; ".join(problems), "; ".join(dict.fromkeys(remedies)))
        names = ", ".join(t.name for t, _, _ in chosen)
        return CheckResult(check_id, title, "ok", f"Cloud Run accepted the update of {names} (validate only: "
                           "nothing changed)")

    return Check(check_id, title, run)


def cloudrun_checks(targets: Sequence[Target], deployer_of: Callable[[Target], Deployer],
                    image_of: Callable[[Target], str]) -> list[Check]:
    """The Cloud Run checks of a deploy (``traffic``, ``validate``); none when no target is on Cloud Run."""
    chosen = [t for t in targets if t.is_cloudrun]
    if not chosen:
        return []
    return [traffic_check([(t, deployer_of(t)) for t in chosen]),
            validate_check([(t, deployer_of(t), image_of(t)) for t in chosen])]
