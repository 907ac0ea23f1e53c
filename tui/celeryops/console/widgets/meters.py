"""Pictures for the drain: the empty-streak meter (blocks, n of N, resets visibly), per-worker state badges,
and the countdown to max wait (bar + time left)."""

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
            text.append(f"  reset (was {self.reset_from}): tasks appeared", style="bold yellow")
        elif self.required and self.streak >= self.required:
            text.append("  drained", style="bold green")
        return text


class WorkerBadges(Static):
    """One coloured badge per worker: green consuming, yellow stopped, red unknown, grey gone."""

    def set_workers(self, states: dict[str, str]) -> None:
        text = Text("Workers ", style="bold")
        for name in sorted(states):
            text.append_text(badge(name, states[name]))
            text.append(" ")
        if not states:
            text.append("none known", style="dim")
        self.update(text)


class Countdown(Static):
    """Time to max wait: elapsed as a bar, then the time left."""

    def set_time(self, elapsed: float, remaining: float) -> None:
        total = elapsed + remaining
        width = max(10, min(40, self.size.width - 40)) if self.size.width else 30
        style = "red" if total and remaining < total * 0.1 else "cyan"
        text = Text("Max wait ", style="bold")
        text.append(bar(elapsed, total, width), style=style)
        text.append(f" {left(remaining)} left", style="bold" if remaining > 0 else "bold red")
        self.update(text)
