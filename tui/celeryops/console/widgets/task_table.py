"""The active task table of the drain: rows keyed by task id and updated in place (add, update, remove),
never rebuilt, so the cursor stays put and 10,000 rows update quickly."""

from __future__ import annotations

from collections.abc import Iterable

from textual._two_way_dict import TwoWayDict
from textual.widgets import DataTable
from textual.widgets.data_table import CellKey, ColumnKey, RowKey

from celeryops.console.fmt import shorten, since
from celeryops.events import TaskInfo

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
    return f"ETA {task.eta}" if task.eta else "-"


def cells(task: TaskInfo) -> tuple[str, ...]:
    """The row of a task; only State (3) and Running for (4) change while a task id lives."""
    return (task.worker, task.name, task.id[:8], task.state, running_for(task), shorten(task.args, 30))


class TaskTable(DataTable):
    """Active, reserved and scheduled tasks, one row per task id."""

    def __init__(self, **kwargs) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._rows: dict[str, tuple[str, ...]] = {}
        self.filter = ""

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self.add_column(label, key=key)

    def remove_rows(self, keys: list[str]) -> None:
        """Remove many rows at once. ``DataTable.remove_row`` re-indexes every row on each call (O(n) each);
        this re-indexes once. Relies on DataTable internals of the pinned Textual (8.2.x); the Pilot test
        ``test_task_table_updates_rows_in_place`` guards it."""
        if len(keys) <= 1:
            for key in keys:
                self.remove_row(key)
            return
        gone = {RowKey(key) for key in keys}
        order = [row.key for row in self.ordered_rows if row.key not in gone]
        self._row_locations = TwoWayDict({key: index for index, key in enumerate(order)})
        for row_key in gone:
            for column_key in self._data.get(row_key, {}):
                self._updated_cells.discard(CellKey(row_key, column_key))
            self.rows.pop(row_key, None)
            self._data.pop(row_key, None)
        self._require_update_dimensions = True
        self._update_count += 1
        if self.cursor_coordinate.row >= len(order):
            self.cursor_coordinate = self.cursor_coordinate  # clamps to the last row
        self.check_idle()
        self.refresh(layout=True)

    def apply(self, tasks: Iterable[TaskInfo]) -> tuple[int, int, int]:
        """Make the rows match ``tasks`` (after the filter). Returns (added, updated, removed)."""
        rows, needle = self._rows, self.filter
        columns = [ColumnKey(key) for key, _ in COLUMNS]
        seen: set[str] = set()
        new_rows: list[tuple[str, tuple[str, ...]]] = []
        updated = 0
        state_col, running_col = columns[3], columns[4]
        for task in tasks:
            if needle and not matches(task, needle):
                continue
            key = task.id
            seen.add(key)
            old = rows.get(key)
            if old is None:
                new_rows.append((key, cells(task)))
                continue
            state, running = task.state, running_for(task)
            if state != old[3] or running != old[4]:
                # As update_cell() does, minus one refresh per cell: one refresh for the whole update below.
                data = self._data[key]  # type: ignore[index]  # RowKey hashes and compares like its str
                data[state_col], data[running_col] = state, running
                rows[key] = (*old[:3], state, running, old[5])
                updated += 1
        removed = [key for key in rows if key not in seen]
        self.remove_rows(removed)
        for key in removed:
            del rows[key]
        for key, row in new_rows:
            self.add_row(*row, key=key)
            rows[key] = row
        if updated:
            self._update_count += 1
            self.refresh()
        return len(new_rows), updated, len(removed)
