"""The console's task table on textual-fastdatatable's DataTable, for ``bench_console.py --fastdatatable`` (not a
benchmark itself; needs ``pip install textual-fastdatatable``, which is not a dependency of celeryops). The names with
a leading underscore here are fastdatatable's, not Textual's."""

from __future__ import annotations

from typing import Any

from textual.coordinate import Coordinate

from celeryops.console.widgets.task_table import TaskTable


def fastdatatable_task_table() -> type[TaskTable]:
    """The task table on textual-fastdatatable's DataTable (what harlequin uses for big tables), updated the fastest
    way its API allows: each poll replaces the table's data with a new Arrow table of every row. Its rows are
    addressed by index, not by key, and the in-place calls cost more: ``update_cell`` turns the whole column into
    Python values and back, ``remove_row`` rebuilds the table from slices, each once per call. The texts are made as
    TaskTable makes them (``cells``), each row's kept while its runtime stays in the span its text covers."""
    from textual_fastdatatable import ArrowBackend
    from textual_fastdatatable import DataTable as FastDataTable

    from celeryops.console.timefmt import natural_span
    from celeryops.console.widgets.task_rows import COLUMNS, cells, matches

    labels = [label for _, label in COLUMNS]
    column_index = {key: i for i, (key, _) in enumerate(COLUMNS)}

    class FastTaskTable(FastDataTable):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(backend=ArrowBackend.from_records([labels], has_header=True), cursor_type="row",
                             zebra_stripes=True, **kwargs)
            self.filter = ""
            self._ids: list[str] = []
            self._texts: dict[str, tuple[str, float, float, tuple[str, ...]]] = {}  # id -> state, span, cells

        def _cells(self, task: Any) -> tuple[str, ...]:
            kept = self._texts.get(task.id)
            runtime = task.runtime
            if (kept is not None and kept[0] == task.state == "active" and runtime is not None
                    and kept[1] < runtime < kept[2]):
                return kept[3]
            row = cells(task)
            if task.state == "active" and runtime is not None:
                seconds = max(0, round(runtime))
                until = natural_span(seconds)[1]
                self._texts[task.id] = (task.state, seconds - 0.5, until - 0.5, row)
            return row

        def apply(self, tasks: Any) -> tuple[int, int, int]:
            wanted = {t.id: t for t in tasks if matches(t, self.filter)}
            rows = [self._cells(t) for t in wanted.values()]
            cursor_id = self._ids[self.cursor_row] if 0 <= self.cursor_row < len(self._ids) else None
            self._texts = {key: self._texts[key] for key in wanted if key in self._texts}
            self._ids = list(wanted)
            self.backend = ArrowBackend.from_records([labels, *rows], has_header=True)
            self._ordered_columns = None
            self._update_count += 1
            self._clear_caches()
            self._require_update_dimensions = True
            if cursor_id in wanted:
                self.move_cursor(row=self._ids.index(cursor_id))
            self.refresh()
            self.check_idle()
            return len(rows), 0, 0

        def get_cell(self, row_key: str, column_key: str) -> Any:
            return self.get_cell_at(Coordinate(self._ids.index(row_key), column_index[column_key]))

    return FastTaskTable  # type: ignore[return-value]
