"""A resource's recent use on an absolute scale: one bar per sample (the busiest sample of each column when there
are more samples than columns), its height the share of the resource's total in use. Textual's Sparkline scales
between the data's own minimum and maximum, so a pool held full all along drew as empty; an operator reading the
slots view needs 4/4 to look full and 0/4 empty."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget

BARS = "▁▂▃▄▅▆▇█"  # the lowest is the floor: nothing in use
FULL = len(BARS) - 1


def usage_columns(history: Sequence[int], total: int, width: int) -> list[int]:
    """The level (0 = nothing in use, 1..7 = a share of ``total``, 7 = full) of each of at most ``width``
    columns, newest last; with more samples than columns, each column shows the busiest of its samples."""
    if width <= 0 or not history:
        return []
    if len(history) > width:
        edges = [round(i * len(history) / width) for i in range(width + 1)]
        history = [max(history[a:b]) for a, b in itertools.pairwise(edges)]
    levels = []
    for used in history:
        share = min(max(used, 0) / total, 1.0) if total > 0 else 0.0
        levels.append(0 if used <= 0 else max(1, round(share * FULL)))
    return levels


def usage_text(history: Sequence[int], total: int, width: int) -> Text:
    """The strip as text, newest at the right edge: a dim floor where nothing was in use, red where the resource
    was full."""
    levels = usage_columns(history, total, width)
    text = Text(" " * (width - len(levels)))
    for level in levels:
        if level == 0:
            text.append(BARS[0], style="dim")
        else:
            text.append(BARS[level], style="bold red" if level == FULL else "green")
    return text


class UsageStrip(Widget):
    """``▁▁▃▃█████`` for the slots used over the last samples, scaled to the resource's total."""

    def __init__(self, history: Sequence[int], total: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.history = list(history)
        self.total = total

    def render(self) -> Text:
        return usage_text(self.history, self.total, self.size.width)
