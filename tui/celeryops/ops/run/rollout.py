"""The deploy step of a run: roll the release's image out to every target (each start written ahead in the journal),
ask a target how an interrupted rollout went, and wait for the fleet to come back. Used by the run session only."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import cast

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
from celeryops.ops.journal import FleetStoreDown, Run
from celeryops.ops.run.recovery import Rollout
from celeryops.ops.run.runner import Runner


@dataclass
class DeployFailure:
    """A target refused or failed the rollout; ``started``: the update reached it (its outcome decides recovery)."""

    target: Target
    message: str
    started: bool
    rollout: Rollout = "not_started"
    logs_url: str = ""


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
        journal = self.runner.journal.aio
        results: list[DeployResult] = []
        for target in targets:
            deployer = self.deployer(target)
            image = target.image_for(sha, release, release)
            try:
                before = await deployer.current(target)
            except DeployError as err:
                return DeployFailure(target, str(err), started=False, logs_url=err.logs_url)
            try:
                intent = await journal.intend_deploy(run_id, target=target.name, image=image,
                                                     previous=before.to_dict())
            except FleetStoreDown as err:  # not recorded where a teammate could recover it: not started
                return DeployFailure(target, str(err), started=False)
            try:
                result = await deployer.deploy(target, image, self._progress, sha=sha, release=release)
            except DeployError as err:
                await journal.settle(intent, {"ok": False, "error": str(err)})
                rollout: Rollout = "unknown"
                with contextlib.suppress(Exception):
                    rollout = await deployer.rollout_outcome(target, before, image)
                return DeployFailure(target, str(err), started=True, rollout=rollout, logs_url=err.logs_url)
            await journal.settle(intent, {"ok": True, "revision": result.revision})
            results.append(result)
        return results

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
