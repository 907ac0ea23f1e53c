"""The whole release flow (no Textual): preflight -> stop consumers -> drain -> deploy -> done.

Every step is recorded in the run journal before it happens; every interruption follows the recovery rules
(deploy started => consumers are not restored unless the rollout failed or never took effect). The headless
``celeryops deploy`` and the console drive the same ``ReleaseFlow``; operator decisions come in through ``confirm``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from celeryops.adapters.deploy import DeployError, Deployers
from celeryops.adapters.deploy.base import Deployer, DeployResult, RolloutState
from celeryops.adapters.gitrepo import GitRepo
from celeryops.core.config import Config, Target
from celeryops.core.errors import EXIT_DEPLOY, EXIT_OK, EXIT_PREFLIGHT, EXIT_TIMEOUT, UserError
from celeryops.core.events import Event, Notice
from celeryops.ops.drain import DrainSettings
from celeryops.ops.journal import Run
from celeryops.ops.preflight import Check, CheckResult, PreflightReport, is_accepted, run_checks, unaccepted_warnings
from celeryops.ops.preflight.checks import (
    cloudrun_checks,
    fence_plugin_check,
    freshness_check,
    image_check,
    permissions_check,
    release_branch_check,
)
from celeryops.ops.recovery import Rollout
from celeryops.ops.runlease import read_lease
from celeryops.ops.runner import Runner

Confirm = Callable[[str], Awaitable[bool]]
Stage = Literal["preflight", "drain", "deploy", "verify", "done"]


@dataclass(frozen=True)
class StageEvent(Event):
    """A step of the release flow begins (``preflight``, ``drain``, ``deploy``, ``verify``) or it is ``done``."""

    stage: str
    detail: str = ""
    kind: str = field(init=False, default="stage")


@dataclass(frozen=True)
class CheckEvent(Event):
    """A preflight check started (``status`` "running") or finished (ok / warn / fail)."""

    id: str
    title: str
    status: str
    detail: str = ""
    remedy: str = ""
    accepted: bool = False  # a warning the operator accepted (--accept-warning(s) or [preflight] accept)
    kind: str = field(init=False, default="check")


@dataclass(frozen=True)
class DeployProgressEvent(Event):
    target: str
    text: str
    kind: str = field(init=False, default="deploy")


@dataclass(frozen=True)
class FleetBack(Event):
    """After the deploy: which workers consume which queues."""

    workers: dict[str, tuple[str, ...]]
    kind: str = field(init=False, default="fleet")


@dataclass(frozen=True)
class ReleaseFinished(Event):
    outcome: str  # deployed | preflight_failed | declined | timeout | deploy_failed | interrupted
    exit_code: int
    message: str
    targets: tuple[dict[str, str], ...] = ()  # deployed: per target, DeployResult.summary() (revision, URLs)
    logs_url: str = ""  # deploy_failed: the Logs URL Cloud Run attached to the failure
    kind: str = field(init=False, default="finished")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"event": self.outcome, "exit_code": self.exit_code, "message": self.message}
        if self.targets:
            data["targets"] = [dict(t) for t in self.targets]
        if self.logs_url:
            data["logs_url"] = self.logs_url
        return data


@dataclass
class ReleaseFlow:
    runner: Runner
    config: Config
    release: str
    targets: tuple[Target, ...]
    repo: Path = field(default_factory=Path.cwd)
    accept_warnings: bool = False
    confirm: Confirm | None = None  # None: --yes
    deployers: dict[str, Deployer] = field(default_factory=dict)  # overrides by target name
    sha: str = ""
    report: PreflightReport | None = None
    accept: tuple[str, ...] = ()  # ids of checks whose warnings are accepted (--accept-warning), with the config's
    _pending: set[asyncio.Future[None]] = field(default_factory=set)
    _deployer_set: Deployers | None = None

    def emit(self, event: Event) -> None:
        self.runner.emit(event)

    def deployer(self, target: Target) -> Deployer:
        if self._deployer_set is None:  # one set per run: credentials once, one channel per target
            self._deployer_set = Deployers(self.deployers)
        return self._deployer_set(target)

    @property
    def accepted_ids(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.accept, *self.config.preflight.accept)))

    async def close_deployers(self) -> None:
        if self._deployer_set is not None:
            with contextlib.suppress(Exception):
                await self._deployer_set.close()

    # -- preflight ---------------------------------------------------------------------------------------------

    def checks(self) -> list[Check]:
        git = GitRepo(self.repo)
        rel = self.config.release
        images = [t.image_for(self.sha, self.release, self.release) for t in self.targets if t.image]
        checks = [
            release_branch_check(git, rel.remote, self.release),
            freshness_check(git, rel.remote, self.release, rel.max_age_days, sha=self.sha or None),
            permissions_check([(t.name, _missing(self.deployer(t), t)) for t in self.targets]),
            *cloudrun_checks(self.targets, self.deployer, lambda t: t.image_for(self.sha, self.release, self.release)),
            Check("fleet", "Broker, workers and run lease", self._fleet_check, timeout=20),
            fence_plugin_check(self.runner.fleet.app, self.runner.fleet_name),
        ]
        if images:
            checks.insert(1, image_check(images))
        return checks

    async def _fleet_check(self) -> CheckResult:
        fleet = self.runner.fleet
        try:
            await fleet.check_broker()
        except UserError as err:
            return CheckResult("fleet", "", "fail", str(err), "start the broker or fix --broker / -A")
        answered = await fleet.ping()
        if not answered:
            return CheckResult("fleet", "", "fail", f"no worker answered on {fleet.display_url}",
                               "start the workers (or check that they use this broker)")
        if self.runner.coord is not None:
            holder = await asyncio.to_thread(read_lease, self.runner.coord, self.runner.fleet_name)
            if holder is not None:
                state = "orphaned" if holder.orphaned else "live"
                return CheckResult("fleet", "", "fail", f"another run holds the fleet ({state}): {holder.describe()}",
                                   "wait for it, or take over an orphaned run with --take-over")
        return CheckResult("fleet", "", "ok", f"{len(answered)} worker(s) answer on {fleet.display_url}")

    async def preflight(self) -> PreflightReport:
        self.emit(StageEvent(stage="preflight", detail=f"release {self.release}"))
        self.sha = await GitRepo(self.repo).ls_remote(self.config.release.remote, self.release) or ""

        def on_check(event: Any) -> None:
            result = getattr(event, "result", None)
            if result is None:
                self.emit(CheckEvent(id=event.id, title=event.title, status="running"))
            else:
                self.emit(CheckEvent(id=result.id, title=result.title, status=result.status, detail=result.detail,
                                     remedy=result.remedy,
                                     accepted=is_accepted(result, self.accept_warnings, self.accepted_ids)))

        self.report = await run_checks(self.checks(), on_check)
        return self.report

    # -- the flow ----------------------------------------------------------------------------------------------

    async def run(self) -> ReleaseFinished:
        self.runner._refuse_if_read_only("deploy")
        report = await self.preflight()
        if report.failed:
            names = ", ".join(r.title for r in report.failed)
            return self._finish("preflight_failed", EXIT_PREFLIGHT,
                                f"Preflight failed ({names}): nothing was stopped or deployed; fix what the checks "
                                "say and run the deploy again.")
        unaccepted = unaccepted_warnings(report, self.accept_warnings, self.accepted_ids)
        if unaccepted:
            names = ", ".join(r.title for r in unaccepted)
            flags = " ".join(f"--accept-warning {r.id}" for r in unaccepted)
            return self._finish("preflight_failed", EXIT_PREFLIGHT,
                                f"Preflight has warnings ({names}): nothing was stopped or deployed; read them, then "
                                f"run again with {flags} (or --accept-warnings) to go ahead anyway.")
        if not await self._ask(f"Stop the consumers of the fleet and drain it for release {self.release}?"):
            return self._finish("declined", EXIT_OK, "Declined before stopping consumers: nothing was changed.")
        cfg = self.config.drain
        settings = DrainSettings(interval=cfg.interval, streak=cfg.streak, max_wait=cfg.max_wait)
        self.emit(StageEvent(stage="drain"))
        try:
            outcome, run = await self.runner.drain(settings=settings, release=self.release, keep_lease=True,
                                                   extra_settings={"sha": self.sha,
                                                                   "targets": [t.name for t in self.targets]})
            if outcome == "timeout":
                return self._finish("timeout", EXIT_TIMEOUT, "The drain timed out: nothing was killed or deployed, "
                                                             "the consumers were restored.")
            if not await self._ask(f"Drained. Deploy release {self.release} to "
                                   f"{', '.join(t.name for t in self.targets)} now?"):
                plan, _ = await self.runner.abort(run=run)
                return self._finish("declined", EXIT_OK, "Declined before deploying: " + plan.explanation)
            return await self._deploy(run.id)
        except asyncio.CancelledError:
            # Interrupted after the drain (also inside runner.drain() right after its `drained` record): the run
            # is open with its consumers stopped; apply the recovery rules before exiting, as the exit line says.
            current = await asyncio.to_thread(self.runner.unfinished)
            if current is not None and current.release == self.release and not self.runner.detached:
                await self._recover_interrupted(current)
            raise
        finally:
            await self.runner.release_lease()
            await self.close_deployers()

    async def _recover_interrupted(self, run: Run) -> None:
        """Recovery with the rollout's real outcome (a second interrupt does not cut it short)."""

        async def recover() -> None:
            await self.runner.abort(run=run, rollout=await self._rollout_of(run))

        task = asyncio.ensure_future(recover())
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
        with contextlib.suppress(Exception):
            task.result()

    # -- resume --------------------------------------------------------------------------------------------------

    async def resume(self, run: Run) -> ReleaseFinished:
        """Continue an interrupted release run from its phase: still draining -> drain, then deploy; drained ->
        deploy; deploying/deployed -> ask the target how the rollout went and follow the recovery rules."""
        self.sha = str(run.settings.get("sha") or self.sha)
        if run.phase in ("preflight", "stopping", "draining", "drained"):
            self.emit(StageEvent(stage="drain", detail=f"resuming run {run.id}"))
            outcome, run = await self.runner.resume(run=run, keep_lease=True)
            try:
                if outcome != "drained":
                    return self._finish("timeout", EXIT_TIMEOUT, "The drain timed out: nothing was killed or "
                                                                 "deployed, the consumers were restored.")
                return await self._deploy(run.id)
            finally:
                await self.runner.release_lease()
                await self.close_deployers()
        # deploying / deployed: the deploy was started; its outcome decides.
        await self.runner.hold(run)
        try:
            rollout = await self._rollout_of(run)
            plan = self.runner.recovery_plan(run, rollout)
            if plan.action == "leave":
                if run.phase == "deploying":
                    await self.runner.journal.aio.advance(run.id, "deployed", reason="resume: rollout ready")
                workers = await self._fleet_back()
                self.emit(FleetBack(workers=workers))
                await self.runner.journal.aio.advance(run.id, "done", reason="resume")
                self.runner.publish_phase("done")
                await self.runner.lift_fence(run.id)
                return self._finish("deployed", EXIT_OK, f"Release {run.release} is deployed (the new revision is "
                                                         "ready): the run is finished.")
        finally:
            await self.runner.release_lease()
            await self.close_deployers()
        decided, _restored = await self.runner.abort(run=run, rollout=rollout)
        if decided.action == "ask":
            return self._finish("deploy_failed", EXIT_DEPLOY, decided.explanation)
        return self._finish("deploy_failed", EXIT_DEPLOY, "The deploy did not take effect: " + decided.explanation)

    async def _rollout_of(self, run: Run) -> Rollout:
        """``ready`` only when every started target serves the new image; ``unknown`` if any cannot be asked."""
        outcomes: list[str] = []
        for start in run.intents("deploy_start"):
            payload = start.payload
            try:
                target = self.config.target(str(payload.get("target")))
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

    async def _deploy(self, run_id: str) -> ReleaseFinished:
        journal = self.runner.journal.aio
        await journal.advance(run_id, "deploying")
        self.runner.publish_phase("deploying")
        self.emit(StageEvent(stage="deploy", detail=", ".join(t.name for t in self.targets)))
        await self.runner.exempt_from_fence([self.sha, self.sha[:7], self.release])
        results: list[DeployResult] = []
        for target in self.targets:
            deployer = self.deployer(target)
            image = target.image_for(self.sha, self.release, self.release)
            try:
                before = await deployer.current(target)
            except DeployError as err:
                return await self._deploy_failed(run_id, target, str(err), started=False)
            intent = await journal.intend_deploy(run_id, target=target.name, image=image,
                                                 previous=before.to_dict())

            def progress(event: Any, name: str = target.name) -> None:
                text = getattr(event, "text", None) or str(event)
                self.emit(DeployProgressEvent(target=name, text=text))
                revision = getattr(event, "revision", "")
                if revision:
                    self._pending.add(asyncio.ensure_future(
                        self.runner.exempt_from_fence([], revisions=[revision.rsplit("/", 1)[-1]])))

            try:
                result = await deployer.deploy(target, image, progress, sha=self.sha, release=self.release)
            except DeployError as err:
                await journal.settle(intent, {"ok": False, "error": str(err)})
                return await self._deploy_failed(run_id, target, str(err), started=True, before=before, image=image,
                                                 logs_url=err.logs_url)
            await journal.settle(intent, {"ok": True, "revision": result.revision})
            results.append(result)
        await journal.advance(run_id, "deployed")
        self.runner.publish_phase("deployed")
        self.emit(StageEvent(stage="verify", detail="waiting for the fleet to answer"))
        workers = await self._fleet_back()
        self.emit(FleetBack(workers=workers))
        await journal.advance(run_id, "done")
        self.runner.publish_phase("done")
        await self.runner.lift_fence()
        return self._finish("deployed", EXIT_OK,
                            f"Release {self.release} deployed: {len(workers)} worker(s) consume again.",
                            targets=tuple(r.summary() for r in results))

    async def _deploy_failed(self, run_id: str, target: Target, message: str, *, started: bool,
                             before: RolloutState | None = None, image: str = "",
                             logs_url: str = "") -> ReleaseFinished:
        rollout: Any = "not_started"
        if started and before is not None:
            with contextlib.suppress(Exception):
                rollout = await self.deployer(target).rollout_outcome(target, before, image)
        run = await self.runner.journal.aio.get(run_id)
        plan, _restored = await self.runner.abort(run=run, rollout=rollout)
        state = ("consumers restored on the old workers" if plan.action == "restore" else plan.explanation)
        return self._finish("deploy_failed", EXIT_DEPLOY, f"Deploy to {target.name} failed: {message} — {state}.",
                            logs_url=logs_url)

    async def _fleet_back(self, timeout: float = 120.0) -> dict[str, tuple[str, ...]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                answered = await self.runner.fleet.ping()
                queues = await self.runner.fleet.active_queues(sorted(answered)) if answered else {}
            except Exception:  # the broker blinked (restart, failover): the deploy is done, keep verifying
                answered, queues = set(), {}
            consuming = {w: q for w, q in queues.items() if q}
            if consuming or loop.time() > deadline:
                if not consuming:
                    self.emit(Notice(level="warning", message="No worker consumes yet after the deploy; check the "
                                                              "new revision's logs."))
                return consuming
            await asyncio.sleep(1.0)

    async def _ask(self, question: str) -> bool:
        return True if self.confirm is None else await self.confirm(question)

    def _finish(self, outcome: str, code: int, message: str, *, targets: tuple[dict[str, str], ...] = (),
                logs_url: str = "") -> ReleaseFinished:
        event = ReleaseFinished(outcome=outcome, exit_code=code, message=message, targets=targets, logs_url=logs_url)
        self.emit(event)
        return event


def _missing(deployer: Deployer, target: Target) -> Callable[[], Awaitable[list[str]]]:
    async def missing() -> list[str]:
        return await deployer.missing_permissions(target)

    return missing
