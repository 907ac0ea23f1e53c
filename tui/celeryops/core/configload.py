"""Reading and validating the configuration into :class:`celeryops.core.config.Config`.

Sources, lowest precedence first: ``--config PATH``, else ``celeryops.toml`` in the working directory, else the
``[tool.celeryops]`` table of ``pyproject.toml``, else nothing (all defaults); then the environment: Celery's
``CELERY_BROKER_URL`` (:data:`celeryops.core.config.CELERY_ENV_KEYS`), then ``CELERYOPS_*``
(:data:`celeryops.core.config.ENV_KEYS`, and :mod:`celeryops.core.runsettings` for the operator-side settings that
only the environment sets); then command-line flags, passed as ``overrides``. Every problem found
becomes one sentence, and all of them are reported together in one UserError with exit code ``EXIT_USAGE``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celeryops.core.autoscale import AutoscaleSettings
from celeryops.core.canary import CanarySettings
from celeryops.core.config import (
    CELERY_ENV_KEYS,
    ENV_KEYS,
    WARNING_CHECKS,
    Config,
    DrainSettings,
    PreflightSettings,
    ReleaseSettings,
    accept_problem,
    did_you_mean,
)
from celeryops.core.configautoscale import validate_autoscale
from celeryops.core.configcanary import validate_canary
from celeryops.core.configcheck import integer, number, type_name, typed, unknown_keys
from celeryops.core.configtargets import validate_targets
from celeryops.core.errors import EXIT_USAGE, UserError
from celeryops.core.masking import mask_text
from celeryops.core.runsettings import run_settings

_TOP_KEYS = ("broker", "app", "state_dir", "drain", "release", "preflight", "targets", "canary", "autoscale")
_DRAIN_KEYS = ("interval", "streak", "max_wait")
_RELEASE_KEYS = ("remote", "max_age_days", "branches")
_PREFLIGHT_KEYS = ("accept",)
_SCALAR_KEYS = ("broker", "app", "state_dir", *(f"drain.{k}" for k in _DRAIN_KEYS),
                *(f"release.{k}" for k in _RELEASE_KEYS))


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

    for var, key in (*CELERY_ENV_KEYS.items(), *ENV_KEYS.items()):  # celeryops' own applied last: they win
        value = env.get(var)
        if value is None or value == "":
            continue
        _apply_scalar(raw, key, value, f"${var}", problems, from_text=True, base_dir=cwd)

    for key, value in (overrides or {}).items():
        if value is None:
            continue
        dotted = _normalise_override_key(key)
        if dotted is None:
            problems.append(f"The setting {key!r} does not exist{did_you_mean(key, _SCALAR_KEYS)}.")
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
        canary=raw["canary"],
        autoscale=raw["autoscale"],
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
    canary = data.get("canary")  # the [canary] table (a TOML table is never null)
    raw["canary"] = validate_canary(canary, problems) if canary is not None else CanarySettings()
    raw["autoscale"] = validate_autoscale(data["autoscale"], problems) if "autoscale" in data else AutoscaleSettings()
    unknown_keys(data, _TOP_KEYS, "", problems)
    for key in ("broker", "app", "state_dir"):
        if key in data:
            _apply_scalar(raw, key, data[key], key, problems, from_text=False, base_dir=base_dir)
    for section, keys in (("drain", _DRAIN_KEYS), ("release", _RELEASE_KEYS)):
        if section not in data:
            continue
        table = data[section]
        if not isinstance(table, dict):
            problems.append(f"{section} must be a table ([{section}]), not {type_name(table)}.")
            continue
        unknown_keys(table, keys, f"{section}.", problems)
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
            raw["targets"] = validate_targets(targets, problems)
    return raw


def _validate_preflight(table: Any, raw: dict[str, Any], problems: list[str]) -> None:
    if not isinstance(table, dict):
        problems.append(f"preflight must be a table ([preflight]), not {type_name(table)}.")
        return
    unknown_keys(table, _PREFLIGHT_KEYS, "preflight.", problems)
    if "accept" not in table:
        return
    ids = table["accept"]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        problems.append(f"preflight.accept must be an array of check ids such as [\"fence\"], not "
                        f"{type_name(ids)} {ids!r}.")
        return
    bad = [p for p in (accept_problem(i, "preflight.accept") for i in ids) if p]
    problems.extend(f"{p}; the checks whose warnings can be accepted are {', '.join(WARNING_CHECKS)}." for p in bad)
    if not bad:
        raw["preflight"]["accept"] = tuple(dict.fromkeys(ids))


def _apply_scalar(raw: dict[str, Any], key: str, value: Any, where: str, problems: list[str], *,
                  from_text: bool, base_dir: Path | None = None) -> None:
    """Validate one scalar setting and store it into ``raw`` (``drain.x`` keys go into ``raw['drain']``)."""
    if key == "release.branches":
        pattern = typed(value, str, where, problems)
        if pattern is not None:
            problem = _branch_pattern_problem(pattern)
            if problem:
                problems.append(f"{where} {problem}.")
            else:
                raw["release"]["branches"] = pattern.strip()
        return
    if key in ("broker", "app", "state_dir", "release.remote"):
        text = typed(value, str, where, problems)
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
        seconds = number(value, where, problems, from_text=from_text)
        if seconds is None:
            return
        if not seconds > 0:
            problems.append(f"{where} must be more than 0 seconds, not {value!r}.")
            return
        raw[section][name] = seconds
        return
    count = integer(value, where, problems, from_text=from_text)
    if count is None:
        return
    minimum = 1 if key == "drain.streak" else 0
    if count < minimum:
        problems.append(f"{where} must be at least {minimum}, not {count}.")
        return
    raw[section][name] = count


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
