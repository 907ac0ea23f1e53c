"""Deployers: roll a release's image out to a target and confirm it serves (no Textual).

:class:`CloudRunDeployer` drives Cloud Run services and worker pools through the async google-cloud-run clients;
:class:`CommandDeployer` runs a shell command. :func:`deployer_for` picks the one a target needs.
"""

from __future__ import annotations

from celeryops.adapters.deploy.base import (
    CommandOutput,
    ConditionChanged,
    Deployer,
    DeployError,
    DeployResult,
    Outcome,
    PollTrouble,
    ProgressCallback,
    ProgressEvent,
    RevisionCreated,
    RolloutReady,
    RolloutStarted,
    RolloutState,
    short_revision,
)
from celeryops.adapters.deploy.cloudrun import CloudRunClients, CloudRunDeployer, default_clients, state_of
from celeryops.adapters.deploy.command import CommandDeployer, render_command
from celeryops.core.config import Target


def deployer_for(target: Target, *, cloudrun: CloudRunDeployer | None = None,
                 command: CommandDeployer | None = None) -> Deployer:
    """The deployer for ``target``'s kind (pass configured instances to override the defaults)."""
    if target.is_cloudrun:
        return cloudrun or CloudRunDeployer()
    return command or CommandDeployer()


__all__ = [
    "CloudRunClients",
    "CloudRunDeployer",
    "CommandDeployer",
    "CommandOutput",
    "ConditionChanged",
    "DeployError",
    "DeployResult",
    "Deployer",
    "Outcome",
    "PollTrouble",
    "ProgressCallback",
    "ProgressEvent",
    "RevisionCreated",
    "RolloutReady",
    "RolloutStarted",
    "RolloutState",
    "default_clients",
    "deployer_for",
    "render_command",
    "short_revision",
    "state_of",
]
