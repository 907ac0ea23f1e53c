"""Text helpers shared by screens: durations through humanize, colours with meaning, shortened args."""

from __future__ import annotations

import datetime as dt
from functools import lru_cache

from rich.text import Text

STATE_STYLE = {
    "consuming": "bold black on green",
    "stopped": "bold black on yellow",
    "unknown": "bold white on red",
    "gone": "dim white on grey23",
}
CHECK_STYLE = {"ok": "bold green", "warn": "bold yellow", "fail": "bold red", "pending": "dim", "running": "cyan"}
CHECK_ICON = {"ok": "✔ ok", "warn": "▲ warn", "fail": "✘ fail", "pending": "· wait"}
ROLLOUT_STYLE = {"pending": "dim", "creating": "cyan", "rolling": "bold cyan", "ready": "bold green",
                 "failed": "bold red"}


def since(seconds: float | None) -> str:
    """``running for`` style: ``3 minutes``."""
    if seconds is None:
        return "-"
    return _since(max(0, round(seconds)))


@lru_cache(maxsize=8192)
def _since(seconds: int) -> str:
    import humanize  # loaded with the first duration shown, not before the console's first frame

    return str(humanize.naturaldelta(dt.timedelta(seconds=seconds)))


def left(seconds: float) -> str:
    """Time left, precise to the second: ``4 minutes and 35 seconds``."""
    if seconds <= 0:
        return "0 seconds"
    import humanize

    return str(humanize.precisedelta(dt.timedelta(seconds=round(seconds)), minimum_unit="seconds", format="%0.0f"))


def shorten(text: str, width: int = 40) -> str:
    """One line, at most ``width`` characters, with an ellipsis when cut."""
    if len(text) <= width and "\n" not in text and "  " not in text:
        return text
    flat = " ".join(text[: width * 2].split())  # only what can be shown is flattened
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def badge(label: str, state: str) -> Text:
    return Text(f" {label} ", style=STATE_STYLE.get(state, "reverse"))


def state_text(state: str) -> Text:
    colour = {"consuming": "green", "stopped": "yellow", "unknown": "bold red", "gone": "dim"}.get(state, "")
    return Text(state, style=colour)


def slots_text(slots: dict[str, int]) -> str:
    return " ".join(f"{name}:{count}" for name, count in sorted(slots.items()))


def bar(used: float, total: float, width: int, *, fill: str = "█", empty: str = "░") -> str:
    """A fixed-width text bar (deterministic, unlike animated widgets)."""
    if total <= 0:
        return empty * width
    filled = max(0, min(width, round(width * used / total)))
    return fill * filled + empty * (width - filled)


def gauge(name: str, used: int, total: int, width: int, name_width: int = 6) -> Text:
    """``cpu   ████░░░░ 11/16``; full in red; a type with no capacity (total 0, e.g. no GPU on the host) reads
    ``none`` in a neutral style, not as full."""
    text = Text(f"{name:<{name_width}}", style="bold")
    if total <= 0:
        text.append("·" * width, style="dim")
        text.append(" none" if used <= 0 else f" {used} in use, none left", style="dim" if used <= 0 else "yellow")
        return text
    full = used >= total
    text.append(bar(used, total, width), style="red" if full else "green")
    text.append(f" {used}/{total}", style="bold red" if full else "bold")
    return text
