"""Checks of single configuration values, shared by :mod:`celeryops.core.configload` and
:mod:`celeryops.core.configtargets`: each appends one sentence per problem to ``problems`` and returns the value
(or None)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from types import UnionType
from typing import Any, TypeVar

from celeryops.core.config import did_you_mean, placeholders

T = TypeVar("T")


def template_problem(where: str, template: str, allowed: tuple[str, ...]) -> str | None:
    try:
        names = placeholders(template)
    except ValueError as exc:
        arg = exc.args[0] if exc.args else ""
        detail = f"the field {arg}" if arg else "unbalanced braces"
        return (f"{where} has {detail}, which is not a placeholder; use {fields(allowed)}, "
                "and write a literal brace as {{ or }}.")
    for name in names:
        if name not in allowed:
            return (f"{where} uses the unknown placeholder {{{name}}}{did_you_mean(name, allowed, braces=True)}; "
                    f"the placeholders are {fields(allowed)}.")
    return None


def fields(names: tuple[str, ...]) -> str:
    return ", ".join("{" + n + "}" for n in names)


def unknown_keys(table: Mapping[str, Any], known: tuple[str, ...], prefix: str, problems: list[str]) -> None:
    for key in table:
        if key not in known:
            problems.append(f"{prefix}{key} is not a setting{did_you_mean(key, known)}.")


def typed(value: Any, kind: type, where: str, problems: list[str]) -> Any:
    if (kind is not bool and isinstance(value, bool)) or not isinstance(value, kind):
        wanted = {str: "a string", bool: "true or false"}[kind]
        problems.append(f"{where} must be {wanted}, not {type_name(value)} {value!r}.")
        return None
    return value


def number(value: Any, where: str, problems: list[str], *, from_text: bool) -> float | None:
    number = _read(value, where, problems, "a number of seconds", int | float, float, from_text=from_text)
    if number is not None and not math.isfinite(number):
        problems.append(f"{where} must be a finite number of seconds, not {value!r}.")
        return None
    return number


def integer(value: Any, where: str, problems: list[str], *, from_text: bool) -> int | None:
    return _read(value, where, problems, "a whole number", int, int, from_text=from_text)


def _read(value: Any, where: str, problems: list[str], wanted: str, kinds: type | UnionType, parse: Callable[[Any], T],
          *, from_text: bool) -> T | None:
    """``value`` as ``parse`` reads it: one of ``kinds`` (never a boolean) or, ``from_text`` (an environment
    variable), a string ``parse`` reads; otherwise None and a sentence saying it must be ``wanted``."""
    if from_text and isinstance(value, str):
        try:
            return parse(value)
        except ValueError:
            problems.append(f"{where} must be {wanted}, not {value!r}.")
            return None
    if isinstance(value, bool) or not isinstance(value, kinds):
        problems.append(f"{where} must be {wanted}, not {type_name(value)} {value!r}.")
        return None
    return parse(value)


def names(value: Any, where: str, what: str, problems: list[str]) -> tuple[str, ...] | None:
    """An array of non-empty strings (``what``: ``queue names such as ["gpu"]``), stripped, each once in its first
    place; None (and a sentence) for anything else."""
    if not isinstance(value, list) or not all(isinstance(n, str) and n.strip() for n in value):
        problems.append(f"{where} must be an array of {what}, not {type_name(value)} {value!r}.")
        return None
    return tuple(dict.fromkeys(n.strip() for n in value))


def type_name(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a float", str: "a string", list: "an array",
             dict: "a table"}
    return names.get(type(value), f"a {type(value).__name__}")


def quoted(names: tuple[str, ...]) -> str:
    return ", ".join(f'"{n}"' for n in names)
