"""celeryops configuration: the typed result (targets, drain/release/preflight settings) and its vocabulary; reading
and validating it is :mod:`celeryops.core.configload` (``load_config``).

Sources, lowest precedence first:

1. ``--config PATH``, else ``celeryops.toml`` in the working directory (keys at the top level), else the
   ``[tool.celeryops]`` table of ``pyproject.toml`` in the working directory, else nothing (all defaults);
2. environment variables: ``CELERYOPS_*`` (see :data:`ENV_KEYS`), and Celery's own ``CELERY_BROKER_URL`` for the
   broker, below ``CELERYOPS_BROKER`` (see :data:`CELERY_ENV_KEYS`);
3. command-line flags, passed to :func:`load_config` as ``overrides``.

Everything is validated at load time. Every problem found becomes one sentence, and all of them are reported
together in a single :class:`~celeryops.core.errors.UserError` with exit code ``EXIT_USAGE``.
"""

from __future__ import annotations

import fnmatch
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from celeryops.core.autoscale import AutoscaleSettings
from celeryops.core.canary import CanarySettings
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.findings import CATALOG as FINDINGS
from celeryops.core.findings import SETTING_FINDINGS
from celeryops.core.runsettings import RunSettings
from celeryops.core.urls import is_loopback

TargetKind = Literal["cloudrun-service", "cloudrun-worker-pool", "command"]
TARGET_KINDS: tuple[TargetKind, ...] = ("cloudrun-service", "cloudrun-worker-pool", "command")
CLOUDRUN_KINDS: tuple[TargetKind, ...] = ("cloudrun-service", "cloudrun-worker-pool")

#: Placeholders an image template may use.
IMAGE_PLACEHOLDERS = ("sha", "short_sha", "branch", "release")
#: Placeholders a ``kind = "command"`` command may use (values are shell-quoted when expanded).
COMMAND_PLACEHOLDERS = ("image", "sha", "short_sha", "release")

DEFAULT_TARGET_TIMEOUT = 1800.0

#: The preflight checks of a deploy, by id (``--accept-warning ID``, ``[preflight] accept``), with what each checks.
PREFLIGHT_CHECKS: dict[str, str] = {
    "branch": "the release branch exists on the remote and matches your checkout (warns when it differs)",
    "image": "each target's image exists in its registry",
    "freshness": "the release commit is not older than release.max_age_days (warns when older)",
    "permissions": "the Cloud Run permissions a deploy needs are granted",
    "traffic": "all traffic (worker pools: instances) will go to the new revision (warns when a tagged revision "
               "keeps old instances running)",
    "revision": "a rollback's revision exists and Cloud Run can serve it (Ready)",
    "validate": "Cloud Run accepts the exact update (sent with validate_only: nothing changes)",
    "broker": "the broker answers",
    "workers": "every known worker answers ping (warns when registered workers are silent)",
    "lease": "no other run holds the fleet (warns when no Redis holds the run lease)",
    "fence": "every worker runs the drain fence plugin of this fleet (warns when some don't; an overlap deploy "
             "fails)",
    "broker_safety": "no Redis of the fleet may evict keys (maxmemory-policy noeviction, or no maxmemory); warns when "
                     "it keeps no data across a restart (no AOF, no RDB)",
    "mixed_versions": "an overlap deploy: old and new code consume the same queues for a while (warns)",
    "settings": "`celeryops doctor`: no worker setting loses or duplicates work (each finding is a warning of its own, "
                "under the finding's id)",
    **{finding: f"`celeryops doctor`'s finding: {FINDINGS[finding].title.lower()} (warns)"
       for finding in SETTING_FINDINGS},
}
#: The checks that can warn, hence whose warnings can be accepted; the others only pass or fail.
WARNING_CHECKS = ("branch", "freshness", "traffic", "workers", "lease", "fence", "mixed_versions", "broker_safety",
                  *SETTING_FINDINGS)
#: Values of a target's ``traffic`` key.
TRAFFIC_MODES = ("latest",)
#: How a deploy replaces a target's workers (a target's ``strategy``, ``celeryops deploy --strategy``), as the config
#: schema knows it: each strategy's name and the target kinds it runs on. ``drain`` stops every consumer, waits until
#: nothing runs, deploys, then the new workers consume (the default; every kind); ``overlap`` brings the new revision
#: up beside the old one, stops only the old revision's consumers and moves the instances once the old ones are idle:
#: processing never pauses; ``canary`` runs ``[canary] instances`` of the new revision beside the old ones, compares
#: their task outcomes, then promotes (the overlap's cutover) or rolls back (both: Cloud Run worker pools only). What
#: a strategy does and says is its module's in ``celeryops.ops.run.strategies`` (a test keeps the two lists equal).
STRATEGY_KINDS: dict[str, tuple[TargetKind, ...]] = {
    "drain": TARGET_KINDS,
    "overlap": ("cloudrun-worker-pool",),
    "canary": ("cloudrun-worker-pool",),
}
STRATEGY_NAMES: tuple[str, ...] = tuple(STRATEGY_KINDS)
DEFAULT_STRATEGY = STRATEGY_NAMES[0]

#: Environment variable -> dotted configuration key.
ENV_KEYS: dict[str, str] = {
    "CELERYOPS_BROKER": "broker",
    "CELERYOPS_APP": "app",
    "CELERYOPS_STATE_DIR": "state_dir",
    "CELERYOPS_DRAIN_INTERVAL": "drain.interval",
    "CELERYOPS_DRAIN_STREAK": "drain.streak",
    "CELERYOPS_DRAIN_MAX_WAIT": "drain.max_wait",
    "CELERYOPS_RELEASE_REMOTE": "release.remote",
    "CELERYOPS_RELEASE_MAX_AGE_DAYS": "release.max_age_days",
    "CELERYOPS_RELEASE_BRANCHES": "release.branches",
}

#: Celery's own environment variables that celeryops reads too, below its own (``CELERYOPS_BROKER`` wins).
CELERY_ENV_KEYS: dict[str, str] = {"CELERY_BROKER_URL": "broker"}

_TAG_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass(frozen=True)
class DrainSettings:
    """When a fleet counts as drained: ``streak`` empty observations ``interval`` seconds apart, within
    ``max_wait`` seconds."""

    interval: float = 15.0
    streak: int = 2
    max_wait: float = 1200.0

    def validate(self) -> None:
        if self.interval <= 0:
            raise ValueError("interval must be > 0 seconds")
        if self.streak < 1:
            raise ValueError("streak must be at least 1")
        if self.max_wait <= 0:
            raise ValueError("max_wait must be > 0 seconds")


@dataclass(frozen=True)
class ReleaseSettings:
    """Which git remote a release must be pushed to, and how old its commit may be."""

    remote: str = "origin"
    max_age_days: int = 14
    branches: str | None = None  # glob over the remote's branch names (``release/*``); None: every branch but
    #                              the remote's default one (the console's release picker lists these)

    def is_release(self, branch: str, default: str | None) -> bool:
        """Whether the remote branch ``branch`` is offered as a release (``default``: the remote's HEAD branch)."""
        if self.branches is None:
            return branch != default
        return any(fnmatch.fnmatchcase(branch, p.strip()) for p in self.branches.split(",") if p.strip())


@dataclass(frozen=True)
class PreflightSettings:
    """``accept``: ids of preflight checks whose warnings this fleet lives with (accepted on every deploy)."""

    accept: tuple[str, ...] = ()


def strategy_refusal(target: Target, strategy: str) -> str | None:
    """Why ``target`` cannot be deployed with ``strategy`` (by the kinds it runs on, :data:`STRATEGY_KINDS`), as one
    clause (no final period), or None."""
    kinds = STRATEGY_KINDS.get(strategy, TARGET_KINDS)
    if target.kind in kinds:
        return None
    if target.kind == "cloudrun-service":
        return (f"target {target.name!r} is a Cloud Run service, and the {strategy} strategy runs only on Cloud Run "
                "worker pools (kind = \"cloudrun-worker-pool\"): a service splits requests between revisions, not "
                "queue consumers, so its old revision's workers cannot be told to stop while the new ones consume")
    return (f"target {target.name!r} is a command target, and the {strategy} strategy runs only on Cloud Run worker "
            "pools (kind = \"cloudrun-worker-pool\"), whose revisions it can run side by side")


def accept_problem(check_id: str, where: str) -> str | None:
    """Why ``check_id`` cannot be accepted, as a clause naming ``where`` it came from (no final period), or None."""
    if check_id in WARNING_CHECKS:
        return None
    if check_id in PREFLIGHT_CHECKS:
        return f"{where} names the check {check_id!r}, which passes or fails but never warns"
    hint = did_you_mean(check_id, tuple(PREFLIGHT_CHECKS))
    return f"{where} names the check {check_id!r}, which does not exist{hint}"


@dataclass(frozen=True)
class Target:
    """One place a release is deployed to: a Cloud Run service or worker pool, or a shell command."""

    name: str
    kind: TargetKind
    project: str = ""
    region: str = ""
    resource: str = ""
    container: str = ""
    image: str = ""
    api_endpoint: str = ""
    insecure: bool = False
    command: str = ""
    timeout: float = DEFAULT_TARGET_TIMEOUT
    traffic: str = ""  # "latest": the update also routes all traffic (instances) to the new revision
    strategy: str = DEFAULT_STRATEGY  # how a deploy replaces the workers (on the kinds STRATEGY_KINDS says)

    @property
    def is_cloudrun(self) -> bool:
        return self.kind in CLOUDRUN_KINDS

    @property
    def console_url(self) -> str:
        """The Cloud console page of the target's revisions (empty for a command target)."""
        if self.kind == "cloudrun-service":
            return (f"https://console.cloud.google.com/run/detail/{self.region}/{self.resource}/revisions"
                    f"?project={self.project}")
        if self.kind == "cloudrun-worker-pool":
            return (f"https://console.cloud.google.com/run/worker-pools/details/{self.region}/{self.resource}"
                    f"/revisions?project={self.project}")
        return ""

    @property
    def resource_path(self) -> str:
        """The Cloud Run resource name, ``projects/P/locations/R/services/S`` (or ``.../workerPools/W``)."""
        collection = "services" if self.kind == "cloudrun-service" else "workerPools"
        return f"projects/{self.project}/locations/{self.region}/{collection}/{self.resource}"

    @property
    def display(self) -> str:
        """How errors and screens name the target."""
        if self.kind == "cloudrun-service":
            return f"Cloud Run service {self.resource} in {self.project}/{self.region}"
        if self.kind == "cloudrun-worker-pool":
            return f"Cloud Run worker pool {self.resource} in {self.project}/{self.region}"
        return f"command target {self.name}"

    def image_for(self, sha: str, branch: str = "", release: str = "") -> str:
        """Expand the image template. ``{sha}`` is the full commit sha, ``{short_sha}`` its first 7 characters,
        ``{branch}`` the branch with characters a registry tag cannot hold replaced by ``-``, ``{release}``
        the release name."""
        values = {"sha": sha, "short_sha": sha[:7], "branch": _TAG_UNSAFE.sub("-", branch), "release": release}
        return expand(self.image, values)


@dataclass(frozen=True)
class Config:
    """The validated configuration. ``source`` names the file it came from (None: defaults only)."""

    broker: str | None = None
    app: str | None = None
    state_dir: str | None = None
    drain: DrainSettings = field(default_factory=DrainSettings)
    release: ReleaseSettings = field(default_factory=ReleaseSettings)
    targets: tuple[Target, ...] = ()
    source: str | None = None
    run: RunSettings = field(default_factory=RunSettings)  # from CELERYOPS_* only (core.runsettings)
    preflight: PreflightSettings = field(default_factory=PreflightSettings)
    canary: CanarySettings = field(default_factory=CanarySettings)  # [canary] (core.configcanary)
    autoscale: AutoscaleSettings = field(default_factory=AutoscaleSettings)  # [autoscale] (core.configautoscale)

    def target(self, name: str) -> Target:
        """The target called ``name``; a UserError (with a did-you-mean) when there is none."""
        for target in self.targets:
            if target.name == name:
                return target
        names = [t.name for t in self.targets]
        hint = did_you_mean(name, names)
        known = ", ".join(names) if names else "none are configured"
        raise UserError(f"There is no deploy target {name!r}{hint} (targets: {known}): nothing was deployed; "
                        "pick one of the configured targets.", EXIT_USAGE)


# ----------------------------------------------------------------------------------------------- templates


def placeholders(template: str) -> list[str]:
    """The ``{name}`` fields of a template (``{{``/``}}`` are literal braces). Raises ValueError on a malformed
    template or a field with a conversion, format spec, index or attribute."""
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError:
        raise ValueError("") from None  # unbalanced braces
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if spec or conversion or not name.isidentifier():
            raise ValueError(f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}")
        names.append(name)
    return names


def expand(template: str, values: Mapping[str, str]) -> str:
    """Replace each ``{name}`` of ``template`` by ``values[name]``; ``{{``/``}}`` give literal braces."""
    out: list[str] = []
    for literal, name, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if name is not None:
            out.append(values[name])
    return "".join(out)


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for ``127.x.x.x:PORT``, ``[::1]:PORT``, ``localhost:PORT`` (port optional)."""
    host = endpoint.strip()
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return is_loopback(host)


def did_you_mean(word: str, choices: tuple[str, ...] | list[str], *, braces: bool = False) -> str:
    import difflib  # only to suggest a name for a typo

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {{{close[0]}}}?)" if braces else f" (did you mean {close[0]!r}?)"


__all__ = [
    "CLOUDRUN_KINDS",
    "COMMAND_PLACEHOLDERS",
    "DEFAULT_STRATEGY",
    "ENV_KEYS",
    "IMAGE_PLACEHOLDERS",
    "PREFLIGHT_CHECKS",
    "STRATEGY_KINDS",
    "STRATEGY_NAMES",
    "TARGET_KINDS",
    "TRAFFIC_MODES",
    "WARNING_CHECKS",
    "Config",
    "DrainSettings",
    "PreflightSettings",
    "ReleaseSettings",
    "Target",
    "TargetKind",
    "accept_problem",
    "did_you_mean",
    "expand",
    "is_loopback_endpoint",
    "placeholders",
    "strategy_refusal",
]
