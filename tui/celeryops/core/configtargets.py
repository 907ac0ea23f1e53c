"""Validating the ``[[targets]]`` tables of the configuration into :class:`~celeryops.core.config.Target` values."""

from __future__ import annotations

from typing import Any

from celeryops.core.config import (
    CLOUDRUN_KINDS,
    COMMAND_PLACEHOLDERS,
    IMAGE_PLACEHOLDERS,
    STRATEGY_NAMES,
    TARGET_KINDS,
    TRAFFIC_MODES,
    Target,
    did_you_mean,
    is_loopback_endpoint,
    placeholders,
    strategy_refusal,
)
from celeryops.core.configcheck import number, quoted, template_problem, typed, unknown_keys

_TARGET_KEYS = ("name", "kind", "project", "region", "resource", "container", "image", "api_endpoint", "insecure",
                "command", "timeout", "traffic", "strategy")
_CLOUDRUN_ONLY = ("project", "region", "resource", "container", "api_endpoint", "insecure", "traffic")


def validate_targets(targets: list[dict[str, Any]], problems: list[str]) -> list[Target]:
    result: list[Target] = []
    seen: set[str] = set()
    for index, table in enumerate(targets, start=1):
        label = f"targets[{index}]"
        name = table.get("name")
        if isinstance(name, str) and name.strip():
            label = f"target {name!r}"
        before = len(problems)
        unknown_keys(table, _TARGET_KEYS, f"{label}: ", problems)
        values: dict[str, Any] = {}
        for key in _TARGET_KEYS:
            if key not in table:
                continue
            if key == "insecure":
                checked: Any = typed(table[key], bool, f"{label}: insecure", problems)
            elif key == "timeout":
                checked = number(table[key], f"{label}: timeout", problems, from_text=False)
                if checked is not None and not checked > 0:
                    problems.append(f"{label}: timeout must be more than 0 seconds, not {table[key]!r}.")
                    checked = None
            else:
                checked = typed(table[key], str, f"{label}: {key}", problems)
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
            problems.append(f"{label} has no kind; set kind to one of {quoted(TARGET_KINDS)}.")
        elif isinstance(kind, str) and kind not in TARGET_KINDS:
            problems.append(f"{label}: kind {kind!r} is not a target kind{did_you_mean(kind, TARGET_KINDS)}; "
                            f"use one of {quoted(TARGET_KINDS)}.")
            kind = None
        if kind in CLOUDRUN_KINDS:
            _check_cloudrun_target(label, table, values, problems)
        elif kind == "command":
            _check_command_target(label, table, values, problems)

        strategy = values.get("strategy")
        if isinstance(strategy, str) and strategy not in STRATEGY_NAMES:
            problems.append(f"{label}: strategy {strategy!r} is not a deploy strategy"
                            f"{did_you_mean(strategy, STRATEGY_NAMES)}; use one of {quoted(STRATEGY_NAMES)}.")
        elif isinstance(strategy, str) and isinstance(kind, str) and isinstance(values.get("name"), str):
            refusal = strategy_refusal(Target(name=values["name"], kind=kind), strategy)  # type: ignore[arg-type]
            if refusal:
                problems.append(f"{label}: strategy = \"{strategy}\" is refused: {refusal}; remove it (the default "
                                "is drain) or change the kind.")

        if len(problems) == before and kind is not None:
            result.append(Target(**values))
    return result


def _check_image_template(label: str, values: dict[str, Any], problems: list[str]) -> None:
    """The target's image template (both kinds may have one) uses only the placeholders an image may."""
    if isinstance(values.get("image"), str):
        problem = template_problem(f"{label}: image", values["image"], IMAGE_PLACEHOLDERS)
        if problem:
            problems.append(problem)


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
    _check_image_template(label, values, problems)
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
    problem = template_problem(f"{label}: command", command, COMMAND_PLACEHOLDERS)
    if problem:
        problems.append(problem)
        return
    if "image" in placeholders(command) and "image" not in table:
        problems.append(f"{label}: command uses {{image}} but the target has no image template; add image = "
                        "\"...\".")
    _check_image_template(label, values, problems)
