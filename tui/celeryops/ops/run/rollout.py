"""The deploy step of a run: roll the release's image out to every target (each start written ahead in the journal),
ask a target how an interrupted rollout went, and wait for the fleet to come back. Used by the run session only."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from celeryops.adapters.deploy import DeployError, Deployers
from celeryops.adapters.deploy.base import (
    Deployer,
    DeployResult,
    RevisionCreated,
    RolloutEvent,
    RolloutState,
    Router,
)
from celeryops.core.config import Config, Target
from celeryops.core.events import Event, Notice
from celeryops.ops.journal import DEPLOY_START, FleetStoreDown, Journal, Run
from celeryops.ops.run.recovery import Rollout
from celeryops.ops.run.runner import Runner
from celeryops.ops.run.writeahead import written_ahead


@dataclass
class DeployFailure:
    """A target refused or failed the rollout; ``started``: the update reached it (its outcome decides recovery)."""

    target: Target
    message: str
    started: bool
    rollout: Rollout = "not_started"
    logs_url: str = ""


async def start_target(journal: Journal, run_id: str, target: Target, read: Callable[[], Awaitable[RolloutState]],
                       payload: Callable[[RolloutState], dict[str, Any]], act: Callable[[], Awaitable[DeployResult]], *,
                       settle: Callable[[DeployResult], Mapping[str, Any]],
                       outcome: Callable[[RolloutState], Awaitable[Rollout]]) -> DeployResult | DeployFailure:
    """One target's update (a deploy, or a rollback's route): what it runs now ``read``, the start written ahead
    (``deploy_start`` with ``payload(before)``), then ``act``. A failure is one :class:`DeployFailure`: not started (the
    target unreadable, or the fleet's Redis refused the record), or started, with the target's real ``outcome``."""
    try:
        before = await read()
    except DeployError as err:
        return DeployFailure(target, str(err), started=False, logs_url=err.logs_url)
    try:
        return await written_ahead(journal, run_id, DEPLOY_START, payload(before), act, settle=settle)
    except FleetStoreDown as err:  # not recorded where a teammate could recover it: not started
        return DeployFailure(target, str(err), started=False)
    except DeployError as err:
        rollout: Rollout = "unknown"
        with contextlib.suppress(Exception):
            rollout = await outcome(before)
        return DeployFailure(target, str(err), started=True, rollout=rollout, logs_url=err.logs_url)


@dataclass
class Rollouts:
    """The deployers of the run's targets (credentials resolved once, one channel per target, for the whole run;
    ``overrides`` by target name win); ``close()`` when the run ends."""

    runner: Runner
    config: Config
    overrides: dict[str, Deployer] = field(default_factory=dict)
    _pending: set[asyncio.Future[None]] = field(default_factory=set)
    _set: Deployers | None = None

    def emit(self, event: Event) -> None:
        self.runner.emit(event)

    def deployer(self, target: Target) -> Deployer:
        if self._set is None:
            self._set = Deployers(self.overrides)
        return self._set(target)

    async def close(self) -> None:
        deployers, self._set = self._set, None
        if deployers is not None:
            with contextlib.suppress(Exception):
                await deployers.close()

    async def deploy(self, run_id: str, targets: tuple[Target, ...], sha: str,
                     release: str) -> list[DeployResult] | DeployFailure:
        """Roll out every target in turn; the first failure stops (the caller applies the recovery rules)."""
        results: list[DeployResult] = []
        for target in targets:
            result = await self._deploy_one(run_id, target, sha, release)
            if isinstance(result, DeployFailure):
                return result
            results.append(result)
        return results

    async def _deploy_one(self, run_id: str, target: Target, sha: str, release: str) -> DeployResult | DeployFailure:
        deployer = self.deployer(target)
        image = target.image_for(sha, release, release)
        return await start_target(
            self.runner.journal, run_id, target, lambda: deployer.current(target),
            lambda before: {"target": target.name, "image": image, "previous": before.to_dict()},
            lambda: deployer.deploy(target, image, self._progress, sha=sha, release=release),
            settle=lambda result: {"revision": result.revision},
            outcome=lambda before: deployer.rollout_outcome(target, before, image))

    def _progress(self, event: RolloutEvent) -> None:
        self.emit(event)
        if isinstance(event, RevisionCreated):  # the new revision's workers consume while the old ones stay held
            self._pending.add(asyncio.ensure_future(
                self.runner.exempt_from_fence([], revisions=[event.revision.rsplit("/", 1)[-1]])))

    async def outcome(self, run: Run) -> Rollout:
        """``ready`` only when every started target serves the new image; ``unknown`` if any cannot be asked."""
        outcomes: list[str] = []
        for start in run.intents("deploy_start"):
            payload = start.payload
            try:
                target = self.config.target(str(payload.get("target")))
                if payload.get("split"):  # a rollback routed it to existing revisions: does it serve that split?
                    split = tuple((str(rev), int(pct)) for rev, pct in payload["split"])
                    outcomes.append(await cast(Router, self.deployer(target)).route_outcome(target, split))
                    continue
                before = RolloutState.from_dict(dict(payload.get("previous") or {}))
                outcomes.append(await self.deployer(target).rollout_outcome(target, before, str(payload["image"])))
            except Exception:  # the target cannot be asked: unknown, never guessed
                outcomes.append("unknown")
        if not outcomes:
            return "not_started"
        for worst in ("unknown", "in_progress", "failed"):
            if worst in outcomes:
                return worst  # type: ignore[return-value]
        return "ready"

    async def fleet_back(self, timeout: float = 120.0) -> dict[str, tuple[str, ...]]:
        """Which workers consume again after the deploy (waits up to ``timeout`` for the first)."""
        fleet = self.runner.fleet
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                answered = await fleet.ping()
                queues = await fleet.active_queues(sorted(answered)) if answered else {}
            except Exception:  # the broker blinked (restart, failover): the deploy is done, keep verifying
                answered, queues = set(), {}
            consuming = {w: q for w, q in queues.items() if q}
            if consuming or loop.time() > deadline:
                if not consuming:
                    self.emit(Notice(level="warning", message="No worker consumes yet after the deploy; check the "
                                                              "new revision's logs."))
                return consuming
            await asyncio.sleep(1.0)
