"""Pictures for the drain: the empty-streak meter (blocks, n of N, resets visibly), per-worker state badges,
and the countdown to max wait (bar + time left). Badges and countdown fit the width they get (80 columns too)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from celeryops.console.fmt import badge, bar, left


class StreakMeter(Static):
    """``Empty streak ■■□ 2 of 3``; when the streak drops, it says so until it grows again."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.streak = 0
        self.required = 0
        self.reset_from = 0  # streak value lost by the last reset (0: none to show)

    def set_streak(self, streak: int, required: int) -> None:
        if streak < self.streak:
            self.reset_from = self.streak
        elif streak > self.streak:
            self.reset_from = 0
        self.streak, self.required = streak, required
        self.update(self.render_meter())

    def render_meter(self) -> Text:
        text = Text("Empty streak ", style="bold")
        for i in range(max(self.required, 1)):
            text.append("■ " if i < self.streak else "□ ", style="bold green" if i < self.streak else "dim")
        text.append(f"{self.streak} of {self.required}")
        if self.reset_from:
            why = "" if self.is_mounted and self.screen.has_class("-narrow") else ": tasks appeared"
            text.append(f"  reset (was {self.reset_from}){why}", style="bold yellow")
        elif self.required and self.streak >= self.required:
            text.append("  drained", style="bold green")
        return text


# Most urgent first, so that on a narrow terminal the badges that need the operator stay in view.
BADGE_ORDER = {"unknown": 0, "consuming": 1, "stopped": 2, "gone": 3}


class WorkerBadges(Static):
    """One coloured badge per worker: red unknown, green consuming, yellow stopped, grey gone; at most
    3 lines (2 on a short terminal), the rest summed up as ``+N more`` per state."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.states: dict[str, str] = {}

    @property
    def max_lines(self) -> int:
        return 2 if self.is_mounted and self.screen.has_class("-short") else 3

    def set_workers(self, states: dict[str, str]) -> None:
        self.states = dict(states)
        self.update(self.render_badges(self.size.width or 200))

    def on_resize(self) -> None:
        self.update(self.render_badges(self.size.width or 200))

    def render_badges(self, width: int) -> Text:
        names = sorted(self.states, key=lambda n: (BADGE_ORDER.get(self.states[n], 1), n))
        lines = [Text("Workers ", style="bold")]
        if not names:
            lines[0].append("none known", style="dim")
        for i, name in enumerate(names):
            piece = badge(name, self.states[name])
            if lines[-1].cell_len + piece.cell_len > width and lines[-1].cell_len > 8:
                if len(lines) == self.max_lines:
                    lines[-1].append_text(self._more(names[i:], width - lines[-1].cell_len))
                    break
                lines.append(Text())
            lines[-1].append_text(piece)
            lines[-1].append(" ")
        for line in lines:
            line.rstrip()
        return Text("\n").join(lines)

    def _more(self, rest: list[str], room: int) -> Text:
        counts: dict[str, int] = {}
        for name in rest:
            counts[self.states[name]] = counts.get(self.states[name], 0) + 1
        order = sorted(counts.items(), key=lambda kv: BADGE_ORDER.get(kv[0], 1))
        detail = ", ".join(f"{n} {state}" for state, n in order)
        text = Text(f"+{len(rest)} more ({detail})", style="bold")
        if text.cell_len > room:
            text = Text(f"+{len(rest)}", style="bold")
        return text


def compact_left(seconds: float) -> str:
    """``1h 05m``, ``9m 56s``, ``42s``: the countdown's time when the long form does not fit."""
    s = max(0, round(seconds))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s}s"


class Countdown(Static):
    """Time to max wait: elapsed as a bar, then the time left and the time elapsed, to the second (shortened to
    ``9m 56s`` when narrow). The drain screen moves it every second between polls (:meth:`set_time`)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.elapsed: float | None = None
        self.remaining = 0.0
        self.outcome: str | None = None

    def set_time(self, elapsed: float, remaining: float, outcome: str | None = None) -> None:
        """``outcome``: the drain is over (drained, timeout, ...): the clock stops and says how it ended."""
        self.elapsed, self.remaining, self.outcome = elapsed, remaining, outcome
        self.update(self.render_countdown(self.size.width or 80))

    def on_resize(self) -> None:
        if self.elapsed is not None:
            self.update(self.render_countdown(self.size.width))

    def render_countdown(self, width: int) -> Text:
        elapsed, remaining = self.elapsed or 0.0, self.remaining
        total = elapsed + remaining
        style = "red" if total and remaining < total * 0.1 else "cyan"
        label = "Max wait "
        if self.outcome is not None:
            tail = f" {self.outcome} after {compact_left(elapsed)}"
        else:  # to the second: the clock ticks between polls
            tail = f" {left(remaining)} left · {compact_left(elapsed)} in"
            if width - len(label) - len(tail) < 10:
                tail = f" {compact_left(remaining)} left · {compact_left(elapsed)} in"
            if width - len(label) - len(tail) < 4:
                tail = f" {compact_left(remaining)} left"
        if width - len(label) - len(tail) < 4:
            label = "Wait "
        text = Text(label, style="bold")
        text.append(bar(elapsed, total, max(4, min(40, width - len(label) - len(tail)))), style=style)
        text.append(tail, style="dim" if self.outcome is not None else "bold" if remaining > 0 else "bold red")
        return text
