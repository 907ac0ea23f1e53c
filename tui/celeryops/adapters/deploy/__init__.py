"""Deployers: roll a release's image out to a target and confirm it serves (no Textual).

:class:`CloudRunDeployer` drives Cloud Run services and worker pools through the async google-cloud-run clients;
:class:`CommandDeployer` runs a shell command. :func:`deployer_for` picks the one a target needs.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from celeryops.adapters.deploy.base import (
    PERMISSION_ROLES,
    CommandOutput,
    ConditionChanged,
    Deployer,
    DeployError,
    DeployResult,
    Outcome,
    PollTrouble,
    PoolDeployer,
    PoolUpdate,
    ProgressCallback,
    ProgressEvent,
    RevisionCreated,
    RevisionInfo,
    RolloutReady,
    RolloutStarted,
    RolloutState,
    Router,
    RouteStarted,
    condense,
    describe_split,
    logs_link,
    role_for,
    short_revision,
)
from celeryops.adapters.deploy.command import CommandDeployer, render_command
from celeryops.core.config import Target

if TYPE_CHECKING:
    from celeryops.adapters.deploy.cloudrun import (
        CloudRunClients,
        CloudRunDeployer,
        default_clients,
        resolve_credentials,
        state_of,
    )

# google-cloud-run costs ~0.35 s to import: loaded when a Cloud Run deployer is first needed, not when the deploy
# events' module (deploy.base) or the command deployer is imported.
_CLOUDRUN_NAMES = ("CloudRunClients", "CloudRunDeployer", "default_clients", "resolve_credentials", "state_of")


def __getattr__(name: str) -> Any:
    if name in _CLOUDRUN_NAMES:
        value = getattr(importlib.import_module("celeryops.adapters.deploy.cloudrun"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'celeryops.adapters.deploy' has no attribute {name!r}")


def _cloudrun_deployer() -> CloudRunDeployer:
    from celeryops.adapters.deploy.cloudrun import CloudRunDeployer

    return CloudRunDeployer()


def deployer_for(target: Target, *, cloudrun: CloudRunDeployer | None = None,
                 command: CommandDeployer | None = None) -> Deployer:
    """The deployer for ``target``'s kind (pass configured instances to override the defaults)."""
    if target.is_cloudrun:
        return cloudrun or _cloudrun_deployer()
    return command or CommandDeployer()


class Deployers:
    """The deployers of one run: one CloudRunDeployer shared by every Cloud Run target (credentials resolved
    once, one channel per target), one CommandDeployer; ``overrides`` (by target name) win. ``close()`` at the
    end of the run closes the channels."""

    def __init__(self, overrides: dict[str, Deployer] | None = None) -> None:
        self.overrides = overrides if overrides is not None else {}
        self._cloudrun: CloudRunDeployer | None = None
        self._command: CommandDeployer | None = None

    def __call__(self, target: Target) -> Deployer:
        if target.name in self.overrides:
            return self.overrides[target.name]
        if target.is_cloudrun:
            self._cloudrun = self._cloudrun or _cloudrun_deployer()
            return self._cloudrun
        self._command = self._command or CommandDeployer()
        return self._command

    async def close(self) -> None:
        for deployer in {id(d): d for d in (*self.overrides.values(), self._cloudrun, self._command)
                         if d is not None}.values():
            await deployer.close()


__all__ = [
    "PERMISSION_ROLES",
    "CloudRunClients",
    "CloudRunDeployer",
    "CommandDeployer",
    "CommandOutput",
    "ConditionChanged",
    "DeployError",
    "DeployResult",
    "Deployer",
    "Deployers",
    "Outcome",
    "PollTrouble",
    "PoolDeployer",
    "PoolUpdate",
    "ProgressCallback",
    "ProgressEvent",
    "RevisionCreated",
    "RevisionInfo",
    "RolloutReady",
    "RolloutStarted",
    "RolloutState",
    "RouteStarted",
    "Router",
    "condense",
    "default_clients",
    "deployer_for",
    "describe_split",
    "logs_link",
    "render_command",
    "resolve_credentials",
    "role_for",
    "short_revision",
    "state_of",
]
