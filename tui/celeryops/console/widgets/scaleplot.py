"""The autoscaler's plot: demand (tasks waiting or running) as bars against capacity (instances x tasks each) as a
line, one column per look, both on one scale (Textual's Sparkline scales each series to itself, so two of them
could not be compared). :func:`plot_lines` is pure; :class:`ScalePlot` renders it at the widget's size."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widget import Widget

EIGHTHS = " ▁▂▃▄▅▆▇█"
DEMAND = "bold #e0a030"  # over capacity: "bold red"
OVER = "bold red"
CAPACITY = "bold green"


def plot_lines(points: Sequence[tuple[float, int, int]], width: int, height: int) -> list[Text]:
    """``height`` lines of ``width`` cells: a y-axis label column, then the last looks (``(at, demand, capacity)``)
    right-aligned, demand a bar (red where it exceeds the capacity), capacity a line ``━`` at its level."""
    label_width = 5
    cols = max(1, width - label_width - 1)
    rows = max(1, height)
    shown = list(points)[-cols:]
    top = max([1, *(max(d, c) for _, d, c in shown)])
    lines = [Text() for _ in range(rows)]
    for row, line in enumerate(lines):
        if row == 0:
            line.append(f"{top:>{label_width}}", style="dim")
        elif row == rows - 1:
            line.append(f"{0:>{label_width}}", style="dim")
        else:
            line.append(" " * label_width)
        line.append("│", style="dim")
        line.append(" " * (cols - len(shown)))
    for _, demand, capacity in shown:
        bar = demand * rows * 8 / top  # in eighths of a row
        level = min(rows - 1, int(capacity * rows / top)) if capacity else -1  # the row the capacity line is on
        for row, line in enumerate(lines):
            from_bottom = rows - 1 - row
            fill = max(0.0, min(8.0, bar - from_bottom * 8))
            if from_bottom == level and fill < 8:
                line.append("━", style=CAPACITY)
            elif fill >= 1:
                line.append(EIGHTHS[int(fill)], style=OVER if demand > capacity else DEMAND)
            else:
                line.append(" ")
    return lines


class ScalePlot(Widget):
    """Demand against capacity over the looks it is given (:meth:`show`)."""

    DEFAULT_CSS = "ScalePlot { height: 6; }"

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.points: tuple[tuple[float, int, int], ...] = ()

    def show(self, points: Sequence[tuple[float, int, int]]) -> None:
        if tuple(points) != self.points:
            self.points = tuple(points)
            self.refresh()

    def render(self) -> Text:
        if not self.points:
            return Text("no look published yet", style="dim")
        return Text("\n").join(plot_lines(self.points, self.content_size.width, self.content_size.height))


__all__ = ["ScalePlot", "plot_lines"]
