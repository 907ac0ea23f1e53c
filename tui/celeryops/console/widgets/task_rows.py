"""The task table's rows without the widget: the columns, the text of each cell (humanized runtimes, ETA times),
the filter, and the sequence views of DataTable's rows the table hands to Textual (every row one line high)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import overload

from rich.cells import cell_len
from textual.widgets import DataTable
from textual.widgets.data_table import Row, RowKey

from celeryops.console.fmt import shorten
from celeryops.console.timefmt import since
from celeryops.core.events import TaskInfo

COLUMNS = (("worker", "Worker"), ("name", "Task"), ("id", "Id"), ("state", "State"), ("running", "Running for"),
           ("args", "Args"))


def matches(task: TaskInfo, needle: str) -> bool:
    """The ``/`` filter: worker, task name, id (case-insensitive substring)."""
    if not needle:
        return True
    needle = needle.lower()
    return needle in task.worker.lower() or needle in task.name.lower() or needle in task.id.lower()


def running_for(task: TaskInfo) -> str:
    if task.state == "active":
        return since(task.runtime)
    return eta_text(task.eta) if task.eta else "-"


def eta_text(eta: str) -> str:
    """A scheduled task's ETA as 'ETA Dec 02 23:30 UTC' (Celery reports an ISO time, too wide for the column);
    anything that is not an ISO time is shown as it came."""
    try:
        when = datetime.fromisoformat(eta)
    except ValueError:
        return f"ETA {eta}"
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return f"ETA {when.astimezone(UTC):%b %d %H:%M} UTC"


def cells(task: TaskInfo) -> tuple[str, ...]:
    """The row of a task; only State (3) and Running for (4) change while a task id lives."""
    return (task.worker, task.name, task.id[:8], task.state, running_for(task), shorten(task.args, 30))




def plain_width(value: str) -> int | None:
    """The width DataTable measures for ``value`` in a one-line row, when ``value`` is plain text: printable (no
    line breaks or control codes), no ``[`` (markup) and at most one ``:`` (an emoji code needs two). Else None."""
    if value.isprintable() and "[" not in value and value.count(":") < 2:
        return cell_len(value)
    return None


class OneLineRows:
    """``DataTable._y_offsets`` when every row is one line high: line ``y`` is row ``y``, offset 0. Answers from the
    row index instead of a list of every line rebuilt after each change."""

    def __init__(self, table: DataTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table.rows)

    def __getitem__(self, y: int) -> tuple[RowKey, int]:
        count = len(self._table.rows)
        if y < 0:
            y += count
        if not 0 <= y < count:
            raise IndexError(y)
        key = self._table._row_locations.get_key(y)
        assert key is not None
        return key, 0

    def clear(self) -> None:
        """DataTable.clear() clears its list; there is nothing to clear here."""


class RowsInOrder(Sequence[Row]):
    """``DataTable.ordered_rows`` read from the row index (DataTable rebuilds a list of all rows after each change,
    then sums their heights to place the cursor)."""

    def __init__(self, table: DataTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return len(self._table.rows)

    @overload
    def __getitem__(self, index: int) -> Row: ...

    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...

    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        rows, keys = self._table.rows, self._table._row_locations._reverse
        if isinstance(index, slice):
            return [rows[keys[i]] for i in range(*index.indices(len(rows)))]
        if index < 0:
            index += len(rows)
        if not 0 <= index < len(rows):
            raise IndexError(index)
        return rows[keys[index]]
