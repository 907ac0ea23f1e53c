"""celeryops configuration: where it is read from, how it is validated, and the typed result.

Sources, lowest precedence first:

1. ``--config PATH``, else ``celeryops.toml`` in the working directory (keys at the top level), else the
   ``[tool.celeryops]`` table of ``pyproject.toml`` in the working directory, else nothing (all defaults);
2. ``CELERYOPS_*`` environment variables (see :data:`ENV_KEYS`);
3. command-line flags, passed to :func:`load_config` as ``overrides``.

Everything is validated at load time. Every problem found becomes one sentence, and all of them are reported
together in a single :class:`~celeryops.core.errors.UserError` with exit code ``EXIT_USAGE``.
"""

from __future__ import annotations

import fnmatch
import ipaddress
import math
import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.masking import mask_text
from celeryops.core.runsettings import RunSettings, run_settings

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
    "traffic": "all traffic (worker pools: instances) will go to the new revision",
    "validate": "Cloud Run accepts the exact update (sent with validate_only: nothing changes)",
    "broker": "the broker answers",
    "workers": "every known worker answers ping (warns when registered workers are silent)",
    "lease": "no other run holds the fleet (warns when no Redis holds the run lease)",
    "fence": "every worker runs the drain fence plugin of this fleet (warns when some don't)",
}
#: The checks that can warn, hence whose warnings can be accepted; the others only pass or fail.
WARNING_CHECKS = ("branch", "freshness", "workers", "lease", "fence")
#: Values of a target's ``traffic`` key.
TRAFFIC_MODES = ("latest",)

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

_TOP_KEYS = ("broker", "app", "state_dir", "drain", "release", "preflight", "targets")
_DRAIN_KEYS = ("interval", "streak", "max_wait")
_RELEASE_KEYS = ("remote", "max_age_days", "branches")
_PREFLIGHT_KEYS = ("accept",)
_TARGET_KEYS = ("name", "kind", "project", "region", "resource", "container", "image", "api_endpoint", "insecure",
                "command", "timeout", "traffic")
_CLOUDRUN_ONLY = ("project", "region", "resource", "container", "api_endpoint", "insecure", "traffic")
_SCALAR_KEYS = ("broker", "app", "state_dir", *(f"drain.{k}" for k in _DRAIN_KEYS),
                *(f"release.{k}" for k in _RELEASE_KEYS))
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


def accept_problem(check_id: str, where: str) -> str | None:
    """Why ``check_id`` cannot be accepted, as a clause naming ``where`` it came from (no final period), or None."""
    if check_id in WARNING_CHECKS:
        return None
    if check_id in PREFLIGHT_CHECKS:
        return f"{where} names the check {check_id!r}, which passes or fails but never warns"
    hint = _did_you_mean(check_id, tuple(PREFLIGHT_CHECKS))
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

    def target(self, name: str) -> Target:
        """The target called ``name``; a UserError (with a did-you-mean) when there is none."""
        for target in self.targets:
            if target.name == name:
                return target
        names = [t.name for t in self.targets]
        hint = _did_you_mean(name, names)
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


def _template_problem(where: str, template: str, allowed: tuple[str, ...]) -> str | None:
    try:
        names = placeholders(template)
    except ValueError as exc:
        arg = exc.args[0] if exc.args else ""
        detail = f"the field {arg}" if arg else "unbalanced braces"
        return (f"{where} has {detail}, which is not a placeholder; use {_fields(allowed)}, "
                "and write a literal brace as {{ or }}.")
    for name in names:
        if name not in allowed:
            return (f"{where} uses the unknown placeholder {{{name}}}{_did_you_mean(name, allowed, braces=True)}; "
                    f"the placeholders are {_fields(allowed)}.")
    return None


def _fields(names: tuple[str, ...]) -> str:
    return ", ".join("{" + n + "}" for n in names)


# ----------------------------------------------------------------------------------------------- loading


def load_config(path: str | None, cwd: Path, env: Mapping[str, str],
                overrides: Mapping[str, Any] | None = None) -> Config:
    """Read, merge and validate the configuration.

    ``path`` is ``--config`` (relative to ``cwd``); ``env`` is usually ``os.environ``; ``overrides`` maps keys
    (``broker``, ``app``, ``state_dir``, ``drain.interval`` or ``drain_interval``, ...) to command-line values,
    ``None`` meaning "flag not given". Raises UserError(EXIT_USAGE) listing every problem."""
    data, source = _read_source(path, cwd)
    problems: list[str] = []
    base_dir = Path(source).parent if source else cwd
    raw = _validate_file(data, base_dir, problems)

    for var, key in ENV_KEYS.items():
        value = env.get(var)
        if value is None or value == "":
            continue
        _apply_scalar(raw, key, value, f"${var}", problems, from_text=True, base_dir=cwd)

    for key, value in (overrides or {}).items():
        if value is None:
            continue
        dotted = _normalise_override_key(key)
        if dotted is None:
            problems.append(f"The setting {key!r} does not exist{_did_you_mean(key, _SCALAR_KEYS)}.")
            continue
        _apply_scalar(raw, dotted, value, f"the option for {dotted}", problems,
                      from_text=isinstance(value, str), base_dir=cwd)

    if problems:
        where = source or "the configuration"
        count = "a problem" if len(problems) == 1 else f"{len(problems)} problems"
        raise UserError(mask_text(f"{where} has {count}: " + " ".join(problems)
                                  + " Nothing was run; fix the configuration and try again."), EXIT_USAGE)

    return Config(
        broker=raw.get("broker"),
        app=raw.get("app"),
        state_dir=raw.get("state_dir"),
        drain=DrainSettings(**raw["drain"]),
        release=ReleaseSettings(**raw["release"]),
        targets=tuple(raw["targets"]),
        source=source,
        run=run_settings(env),
        preflight=PreflightSettings(**raw["preflight"]),
    )


def _read_source(path: str | None, cwd: Path) -> tuple[dict[str, Any], str | None]:
    if path is not None:
        file = cwd / Path(path).expanduser()
        if not file.is_file():
            raise UserError(f"The configuration file {file} does not exist: nothing was run; "
                            "check the --config path.", EXIT_USAGE)
        data = _parse(file)
        if file.name == "pyproject.toml":
            return _tool_table(data, file), str(file)
        return data, str(file)
    own = cwd / "celeryops.toml"
    if own.is_file():
        return _parse(own), str(own)
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file():
        data = _parse(pyproject)
        if isinstance(data.get("tool"), dict) and "celeryops" in data["tool"]:
            return _tool_table(data, pyproject), str(pyproject)
    return {}, None


def _parse(file: Path) -> dict[str, Any]:
    try:
        with file.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{file} is not valid TOML ({exc}): nothing was run; fix the syntax and try again.",
                        EXIT_USAGE) from None
    except OSError as exc:
        raise UserError(f"Could not read {file} ({exc.strerror}): nothing was run; check the file's permissions.",
                        EXIT_USAGE) from None


def _tool_table(data: dict[str, Any], file: Path) -> dict[str, Any]:
    table = data.get("tool", {}).get("celeryops", {}) if isinstance(data.get("tool"), dict) else {}
    if not isinstance(table, dict):
        raise UserError(f"{file}: [tool.celeryops] must be a table: nothing was run; fix the file.", EXIT_USAGE)
    return table


def _normalise_override_key(key: str) -> str | None:
    if key in _SCALAR_KEYS:
        return key
    for dotted in _SCALAR_KEYS:
        if dotted.replace(".", "_") == key:
            return dotted
    return None


# ----------------------------------------------------------------------------------------------- validation


def _validate_file(data: dict[str, Any], base_dir: Path, problems: list[str]) -> dict[str, Any]:
    """Check the file's keys and types; returns a working dict with ``drain``/``release`` kwargs and targets."""
    raw: dict[str, Any] = {"drain": {}, "release": {}, "preflight": {}, "targets": []}
    _unknown_keys(data, _TOP_KEYS, "", problems)
    for key in ("broker", "app", "state_dir"):
        if key in data:
            _apply_scalar(raw, key, data[key], key, problems, from_text=False, base_dir=base_dir)
    for section, keys in (("drain", _DRAIN_KEYS), ("release", _RELEASE_KEYS)):
        if section not in data:
            continue
        table = data[section]
        if not isinstance(table, dict):
            problems.append(f"{section} must be a table ([{section}]), not {_type_name(table)}.")
            continue
        _unknown_keys(table, keys, f"{section}.", problems)
        for key in keys:
            if key in table:
                _apply_scalar(raw, f"{section}.{key}", table[key], f"{section}.{key}", problems, from_text=False)
    if "preflight" in data:
        _validate_preflight(data["preflight"], raw, problems)
    if "targets" in data:
        targets = data["targets"]
        if not isinstance(targets, list) or not all(isinstance(t, dict) for t in targets):
            problems.append("targets must be an array of tables ([[targets]]).")
        else:
            raw["targets"] = _validate_targets(targets, problems)
    return raw


def _validate_preflight(table: Any, raw: dict[str, Any], problems: list[str]) -> None:
    if not isinstance(table, dict):
        problems.append(f"preflight must be a table ([preflight]), not {_type_name(table)}.")
        return
    _unknown_keys(table, _PREFLIGHT_KEYS, "preflight.", problems)
    if "accept" not in table:
        return
    ids = table["accept"]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        problems.append(f"preflight.accept must be an array of check ids such as [\"fence\"], not "
                        f"{_type_name(ids)} {ids!r}.")
        return
    bad = [p for p in (accept_problem(i, "preflight.accept") for i in ids) if p]
    problems.extend(f"{p}; the checks whose warnings can be accepted are {', '.join(WARNING_CHECKS)}." for p in bad)
    if not bad:
        raw["preflight"]["accept"] = tuple(dict.fromkeys(ids))


def _apply_scalar(raw: dict[str, Any], key: str, value: Any, where: str, problems: list[str], *,
                  from_text: bool, base_dir: Path | None = None) -> None:
    """Validate one scalar setting and store it into ``raw`` (``drain.x`` keys go into ``raw['drain']``)."""
    if key == "release.branches":
        pattern = _typed(value, str, where, problems)
        if pattern is not None:
            problem = _branch_pattern_problem(pattern)
            if problem:
                problems.append(f"{where} {problem}.")
            else:
                raw["release"]["branches"] = pattern.strip()
        return
    if key in ("broker", "app", "state_dir", "release.remote"):
        text = _typed(value, str, where, problems)
        if text is None:
            return
        if not text.strip():
            problems.append(f"{where} is empty; remove it or give a value.")
            return
        if key == "release.remote":
            raw["release"]["remote"] = text
        else:
            if key == "state_dir" and base_dir is not None:
                text = str(base_dir / Path(text).expanduser())
            raw[key] = text
        return
    section, name = key.split(".")
    if key in ("drain.interval", "drain.max_wait"):
        number = _number(value, where, problems, from_text=from_text)
        if number is None:
            return
        if not number > 0:
            problems.append(f"{where} must be more than 0 seconds, not {value!r}.")
            return
        raw[section][name] = number
        return
    integer = _integer(value, where, problems, from_text=from_text)
    if integer is None:
        return
    minimum = 1 if key == "drain.streak" else 0
    if integer < minimum:
        problems.append(f"{where} must be at least {minimum}, not {integer}.")
        return
    raw[section][name] = integer


def _branch_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` (comma-separated globs over branch names) cannot select release branches, or None."""
    parts = [p.strip() for p in pattern.split(",")]
    if not pattern.strip() or not all(parts):
        return (f"{pattern!r} has an empty pattern; give globs such as \"release/*\" (comma-separated), or remove "
                "it to offer every branch but the default one")
    for part in parts:
        if any(c.isspace() or c in "~^:\\" for c in part) or part.startswith(("-", "/")) or ".." in part:
            return (f"{part!r} cannot match a git branch name (no spaces, ~ ^ : \\ or .., not starting with - "
                    "or /); use a glob such as \"release/*\"")
        if part.count("[") != part.count("]"):
            return f"{part!r} has an unclosed [ ]; use a glob such as \"release/*\" or \"v[0-9]*\""
    return None


def _validate_targets(targets: list[dict[str, Any]], problems: list[str]) -> list[Target]:
    result: list[Target] = []
    seen: set[str] = set()
    for index, table in enumerate(targets, start=1):
        label = f"targets[{index}]"
        name = table.get("name")
        if isinstance(name, str) and name.strip():
            label = f"target {name!r}"
        before = len(problems)
        _unknown_keys(table, _TARGET_KEYS, f"{label}: ", problems)
        values: dict[str, Any] = {}
        for key in _TARGET_KEYS:
            if key not in table:
                continue
            if key == "insecure":
                checked: Any = _typed(table[key], bool, f"{label}: insecure", problems)
            elif key == "timeout":
                checked = _number(table[key], f"{label}: timeout", problems, from_text=False)
                if checked is not None and not checked > 0:
                    problems.append(f"{label}: timeout must be more than 0 seconds, not {table[key]!r}.")
                    checked = None
            else:
                checked = _typed(table[key], str, f"{label}: {key}", problems)
            if checked is not None:
                values[key] = checked

        if "name" not in table:
            problems.append(f"{label} has no name; every target needs a unique name.")
        elif isinstance(values.get("name"), str):
            if not values["name"].strip():
                problems.append(f"{label} has an empty name; every target needs a unique name.")
            elif values["name"] in seen:
                problems.append(f"The target name {values['name']!r} is used twice; target names must be unique.")
            seen.add(values["name"])

        kind = values.get("kind")
        if "kind" not in table:
            problems.append(f"{label} has no kind; set kind to one of {_quoted(TARGET_KINDS)}.")
        elif isinstance(kind, str) and kind not in TARGET_KINDS:
            problems.append(f"{label}: kind {kind!r} is not a target kind{_did_you_mean(kind, TARGET_KINDS)}; "
                            f"use one of {_quoted(TARGET_KINDS)}.")
            kind = None
        if kind in CLOUDRUN_KINDS:
            _check_cloudrun_target(label, table, values, problems)
        elif kind == "command":
            _check_command_target(label, table, values, problems)

        if len(problems) == before and kind is not None:
            result.append(Target(**values))
    return result


def _check_cloudrun_target(label: str, table: dict[str, Any], values: dict[str, Any], problems: list[str]) -> None:
    for key in ("project", "region", "resource", "image"):
        if key not in table:
            problems.append(f"{label} has no {key}; a {values['kind']} target needs project, region, resource "
                            "and image.")
        elif isinstance(values.get(key), str) and not values[key].strip():
            problems.append(f"{label}: {key} is empty.")
    if "command" in table:
        problems.append(f"{label}: command only applies to kind = \"command\"; remove it or change the kind.")
    traffic = values.get("traffic")
    if isinstance(traffic, str) and traffic not in TRAFFIC_MODES:
        problems.append(f"{label}: traffic {traffic!r} is not a traffic mode; use traffic = \"latest\" to route all "
                        "traffic (worker pools: all instances) to the new revision, or remove it.")
    if isinstance(values.get("image"), str):
        problem = _template_problem(f"{label}: image", values["image"], IMAGE_PLACEHOLDERS)
        if problem:
            problems.append(problem)
    endpoint = values.get("api_endpoint")
    if values.get("insecure"):
        if not endpoint:
            problems.append(f"{label}: insecure = true needs an api_endpoint on the loopback interface "
                            "(a local stand-in); remove insecure to use Google's API.")
        elif not is_loopback_endpoint(endpoint):
            problems.append(f"{label}: insecure = true is refused for api_endpoint {endpoint!r}, which is not a "
                            "loopback address; plaintext is allowed only for a local stand-in on 127.0.0.1, ::1 "
                            "or localhost.")


def _check_command_target(label: str, table: dict[str, Any], values: dict[str, Any], problems: list[str]) -> None:
    stray = [key for key in _CLOUDRUN_ONLY if key in table]
    if stray:
        problems.append(f"{label}: {', '.join(stray)} only apply to Cloud Run targets; remove "
                        f"{'it' if len(stray) == 1 else 'them'} or change the kind.")
    command = values.get("command")
    if "command" not in table:
        problems.append(f"{label} has no command; a command target needs command = \"...\".")
        return
    if not isinstance(command, str):
        return
    if not command.strip():
        problems.append(f"{label}: command is empty.")
        return
    problem = _template_problem(f"{label}: command", command, COMMAND_PLACEHOLDERS)
    if problem:
        problems.append(problem)
        return
    if "image" in placeholders(command) and "image" not in table:
        problems.append(f"{label}: command uses {{image}} but the target has no image template; add image = "
                        "\"...\".")
    if isinstance(values.get("image"), str):
        problem = _template_problem(f"{label}: image", values["image"], IMAGE_PLACEHOLDERS)
        if problem:
            problems.append(problem)


def is_loopback_endpoint(endpoint: str) -> bool:
    """True for ``127.x.x.x:PORT``, ``[::1]:PORT``, ``localhost:PORT`` (port optional)."""
    host = endpoint.strip()
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# ----------------------------------------------------------------------------------------------- helpers


def _unknown_keys(table: Mapping[str, Any], known: tuple[str, ...], prefix: str, problems: list[str]) -> None:
    for key in table:
        if key not in known:
            problems.append(f"{prefix}{key} is not a setting{_did_you_mean(key, known)}.")


def _did_you_mean(word: str, choices: tuple[str, ...] | list[str], *, braces: bool = False) -> str:
    import difflib  # only to suggest a name for a typo

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {{{close[0]}}}?)" if braces else f" (did you mean {close[0]!r}?)"


def _typed(value: Any, kind: type, where: str, problems: list[str]) -> Any:
    if (kind is not bool and isinstance(value, bool)) or not isinstance(value, kind):
        wanted = {str: "a string", bool: "true or false"}[kind]
        problems.append(f"{where} must be {wanted}, not {_type_name(value)} {value!r}.")
        return None
    return value


def _number(value: Any, where: str, problems: list[str], *, from_text: bool) -> float | None:
    if from_text and isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            problems.append(f"{where} must be a number of seconds, not {value!r}.")
            return None
    elif isinstance(value, bool) or not isinstance(value, int | float):
        problems.append(f"{where} must be a number of seconds, not {_type_name(value)} {value!r}.")
        return None
    else:
        number = float(value)
    if not math.isfinite(number):
        problems.append(f"{where} must be a finite number of seconds, not {value!r}.")
        return None
    return number


def _integer(value: Any, where: str, problems: list[str], *, from_text: bool) -> int | None:
    if from_text and isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            problems.append(f"{where} must be a whole number, not {value!r}.")
            return None
    if isinstance(value, bool) or not isinstance(value, int):
        problems.append(f"{where} must be a whole number, not {_type_name(value)} {value!r}.")
        return None
    return value


def _type_name(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
             dict: "a table"}
    return names.get(type(value), f"a {type(value).__name__}")


def _quoted(names: tuple[str, ...]) -> str:
    return ", ".join(f'"{n}"' for n in names)


__all__ = [
    "CLOUDRUN_KINDS",
    "COMMAND_PLACEHOLDERS",
    "ENV_KEYS",
    "IMAGE_PLACEHOLDERS",
    "PREFLIGHT_CHECKS",
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
    "expand",
    "is_loopback_endpoint",
    "load_config",
    "placeholders",
]
