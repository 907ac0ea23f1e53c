"""The active task table of the drain: rows keyed by task id and updated in place (add, update, remove),
never rebuilt, so the cursor stays on its task and 10,000 rows update quickly (bench/bench_console.py).

An update costs what changed plus one screenful, not the table's size, where Textual's DataTable walks every row:
- the diff writes the two cells that change (State, Running for) of the rows whose text changed; a row's "running
  for" text is recomputed only when its runtime leaves the span that text covers, and comes from
  :mod:`celeryops.console.timefmt` (humanize's text, without humanize's cost);
- finished rows are removed in one pass and new ones appended in one (DataTable re-indexes every row per removal);
- every row is one line high, so line y is row y (DataTable rebuilds a list of every line, and of every row, after
  each change) and the idle size update measures only the new rows' cells; the row index is rebuilt keyed by str
  (a RowKey hashes in Python);
- painting the visible rows, which every update invalidates, skips Rich for plain-text cells (the cursor's row
  included), keeps the header's cells from one update to the next, and reads the table's styles and settings once
  a frame instead of once a line or a cell; a layout of the screen with the table's sizes unchanged does not redraw
  its scrollbars.
These rely on DataTable internals of the pinned Textual (8.2.x): ``tests/console/test_task_table.py`` drives this
table and a plain DataTable (public API, humanize texts) through the same polls and compares rows, cells, column
widths, size and rendered lines; the snapshots compare the picture."""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from operator import attrgetter
from typing import Any, NamedTuple, Self, TypeVar

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual._two_way_dict import TwoWayDict
from textual._types import SegmentLines
from textual.color import Color
from textual.coordinate import Coordinate
from textual.geometry import Region, Size
from textual.render import measure
from textual.strip import Strip
from textual.widgets import DataTable
from textual.widgets._data_table import default_cell_formatter
from textual.widgets.data_table import (
    CellKey,
    CellType,
    ColumnKey,
    CursorType,
    DuplicateKey,
    Row,
    RowDoesNotExist,
    RowKey,
)

from celeryops.console.timefmt import natural_span
from celeryops.console.widgets.task_rows import (
    COLUMNS,
    OneLineRows,
    RowsInOrder,
    cells,
    eta_text,
    matches,
    plain_width,
    running_for,
)
from celeryops.core.events import TaskInfo

_task_id = attrgetter("id")
_key_value = attrgetter("value")
_T = TypeVar("_T")

__all__ = ["COLUMNS", "TaskTable", "cells", "eta_text", "matches", "plain_width", "running_for"]

class TaskTable(DataTable):
    """Active, reserved and scheduled tasks, one row per task id, one line per row."""

    _frame_styles: dict[object, object] | None = None  # while render_lines() runs

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=True, **kwargs)
        self._rows: dict[str, _Shown] = {}  # task id -> what its row shows
        self.filter = ""
        self._filtered_by = ""  # the filter the rows were chosen with
        self._column_keys: dict[str, ColumnKey] = {}
        self._cell_style_cache: dict[tuple[Style, int, int, Style, Style], Style] = {}  # per row and column
        self._header_cells: dict[tuple[object, ...], SegmentLines] = {}  # see _header_cell
        self._sizes_seen: tuple[object, ...] = ()  # see _size_updated

    def on_mount(self) -> None:
        for key, label in COLUMNS:
            self._column_keys[key] = self.add_column(label, key=key)

    def add_row(self, *cells: CellType, height: int | None = 1, key: str | None = None,
                label: Text | str | None = None) -> RowKey:
        """As DataTable's, for one-line rows without labels only (what the overrides below rely on)."""
        if height != 1 or label is not None:
            raise ValueError("TaskTable rows are one line high and have no label")
        return super().add_row(*cells, height=1, key=key)

    @property
    def _y_offsets(self) -> OneLineRows:  # type: ignore[override]
        return OneLineRows(self)

    @property
    def ordered_rows(self) -> RowsInOrder:  # type: ignore[override]
        return RowsInOrder(self)

    # One frame's styles and settings. DataTable asks for the table's and the row's Rich style (each a walk up the
    # DOM, blending backgrounds) once a line, and reads its reactives once a cell; within one render_lines() call they
    # cannot change, so they are read once.

    def render_lines(self, crop: Region) -> list[Strip]:
        self._frame_styles = {}
        try:
            return super().render_lines(crop)
        finally:
            self._frame_styles = None

    def _once_a_frame(self, key: object, compute: Callable[[], _T]) -> _T:
        memo = self._frame_styles
        if memo is None:
            return compute()
        if key not in memo:
            memo[key] = compute()
        return memo[key]  # type: ignore[return-value]

    @property
    def rich_style(self) -> Style:
        return self._once_a_frame("table", lambda: super(TaskTable, self).rich_style)

    @property
    def background_colors(self) -> tuple[Color, Color]:
        return self._once_a_frame("background", lambda: super(TaskTable, self).background_colors)

    def _get_row_style(self, row_index: int, base_style: Style) -> Style:
        kind = row_index if row_index < 0 else -2 if row_index < self.fixed_rows else row_index % 2
        return self._once_a_frame(("row", kind, base_style),
                                  lambda: super(TaskTable, self)._get_row_style(row_index, base_style))

    def _render_line_in_row(self, row_key: RowKey, line_no: int, base_style: Style, cursor_location: Coordinate,
                            hover_location: Coordinate) -> tuple[SegmentLines, SegmentLines]:
        """DataTable's, for a body row that is neither under the row cursor nor hovered (no labels, no fixed
        columns): its cells (see :meth:`_render_cell`) and the filler to the right, the table's settings read once
        a frame instead of once a cell. Other rows go to DataTable."""
        row_index = self._row_locations.get(row_key)
        frame = self._row_frame()
        if (row_index is None or frame is None or row_index in (cursor_location.row, hover_location.row)
                or row_index < frame.fixed_rows):
            return super()._render_line_in_row(row_key, line_no, base_style, cursor_location, hover_location)
        cursor_type: CursorType = "row"
        cache_key = (row_key, line_no, base_style, cursor_location, hover_location, cursor_type, frame.show_cursor,
                     frame.show_hover_cursor, self._update_count, self._pseudo_class_state)
        cached = self._row_render_cache.get(cache_key)
        if cached is not None:
            return cached
        row_style = self._get_row_style(row_index, base_style)
        render_cell = self._render_cell
        cells = [render_cell(row_index, column_index, row_style, width)[line_no]
                 for column_index, width in enumerate(frame.widths)]
        extend_style, _ = self._get_styles_to_render_cell(False, False, False, False, False, frame.show_cursor,
                                                          frame.show_hover_cursor, False, False)
        extend_style = row_style + extend_style
        extend_style += Style.from_meta({"row": row_index, "column": 0, "out_of_bounds": True})
        cells.append([Segment(" " * frame.filler, extend_style)])
        row_pair: tuple[SegmentLines, SegmentLines] = ([], cells)
        self._row_render_cache[cache_key] = row_pair
        return row_pair

    def _row_frame(self) -> _RowFrame | None:
        """This frame's settings for :meth:`_render_line_in_row`, or None when its shortcut does not apply."""
        return self._once_a_frame("rows", self._read_row_frame)

    def _read_row_frame(self) -> _RowFrame | None:
        if self.cursor_type != "row" or self.fixed_columns or (self._labelled_row_exists and self.show_row_labels):
            return None
        widths = [column.get_render_width(self) for column in self.ordered_columns]
        return _RowFrame(self.show_cursor, self._show_hover_cursor, self.fixed_rows, widths,
                         max(0, self.size.width - sum(widths) - self._row_label_column_width))

    def _render_cell(self, row_index: int, column_index: int, base_style: Style, width: int, cursor: bool = False,
                     hover: bool = False) -> SegmentLines:
        """DataTable's, without Rich for a body cell of plain text that fits (nearly all of them, the cursor's row
        included): the same text and styles in one segment (DataTable lays out Padding(Text) through Rich: ~0.1 ms
        a cell, ~20 ms a screenful, and every update repaints the screenful). Header cells are DataTable's, kept
        from one update to the next (DataTable renders them again after every change to any row). Other cells
        (markup, too wide...) go to DataTable."""
        if row_index == -1 and column_index >= 0:
            return self._header_cell(column_index, base_style, width, cursor, hover)
        if row_index >= 0 and column_index >= 0:
            row_key = self._row_locations.get_key(row_index)
            row = self._data.get(row_key) if row_key is not None else None
            value = row.get(self._column_locations.get_key(column_index)) if row is not None else None  # type: ignore[arg-type]
            text_width = plain_width(value) if isinstance(value, str) else None
            padding, fixed_rows, fixed_columns = self._cell_layout()
            if text_width is not None and text_width + 2 * padding <= width:
                assert isinstance(value, str)
                component_style, post_style = self._cell_styles(
                    row_index < fixed_rows or column_index < fixed_columns, hover, cursor)
                style_key = (base_style, row_index, column_index, component_style, post_style)
                style = self._cell_style_cache.get(style_key)
                if style is None:
                    # As DataTable composes it: the row's style with the cell's meta, the component style, then (as
                    # rich's Segment.apply_style does) the text's own style, which plain text has not, and post_style.
                    style = base_style + Style.from_meta({"row": row_index, "column": column_index}) + component_style
                    if post_style:
                        style = style + post_style if style else post_style
                    if len(self._cell_style_cache) >= 4096:
                        self._cell_style_cache.clear()
                    self._cell_style_cache[style_key] = style
                return [[Segment(" " * padding + value + " " * (width - text_width - padding), style)]]
        return super()._render_cell(row_index, column_index, base_style, width, cursor, hover)

    def _cell_layout(self) -> tuple[int, int, int]:
        """(cell padding, fixed rows, fixed columns): reactives, read once a frame."""
        return self._once_a_frame("layout", lambda: (self.cell_padding, self.fixed_rows, self.fixed_columns))

    def _cell_styles(self, fixed: bool, hover: bool, cursor: bool) -> tuple[Style, Style]:
        """DataTable's component and post styles for a body cell."""
        return self._once_a_frame(("cell", fixed, hover, cursor), lambda: self._get_styles_to_render_cell(
            False, False, fixed, hover, cursor, self.show_cursor, self._show_hover_cursor,
            self.cursor_foreground_priority == "css", self.cursor_background_priority == "css"))

    def _header_cell(self, column_index: int, base_style: Style, width: int, cursor: bool,
                     hover: bool) -> SegmentLines:
        """DataTable's header cell, rendered again only when what it shows changes: its label, width and styles
        (the table's and its header's, which a theme or CSS change moves: :meth:`notify_style_update` forgets them)."""
        key = self._column_locations.get_key(column_index)
        column = self.columns.get(key) if key is not None else None
        if column is None:
            return super()._render_cell(-1, column_index, base_style, width, cursor, hover)
        label = column.label
        cache_key = (column_index, label.plain, label.style, tuple(label.spans), label.justify, label.overflow,
                     base_style, width, cursor, hover, self.show_cursor, self._show_hover_cursor, self.cell_padding,
                     self._pseudo_class_state, self.cursor_foreground_priority, self.cursor_background_priority)
        cell = self._header_cells.get(cache_key)
        if cell is None:
            if len(self._header_cells) >= 256:
                self._header_cells.clear()
            cell = self._header_cells[cache_key] = super()._render_cell(-1, column_index, base_style, width, cursor,
                                                                        hover)
        return cell

    def notify_style_update(self) -> None:
        self._header_cells.clear()
        super().notify_style_update()

    def _measure_cell(self, value: object) -> int:
        if isinstance(value, str):
            width = plain_width(value)
            if width is not None:
                return width
        return measure(self.app.console, default_cell_formatter(value, wrap=False, height=1), 1)

    def _size_updated(self, size: Size, virtual_size: Size, container_size: Size, layout: bool = True) -> bool:
        """ScrollView's, skipped when called again with what it was last called with, the table's own virtual size
        and gutter unchanged: ScrollView compares the compositor's virtual size with the one the table sets itself,
        which always differ, so every layout of the screen (each drain poll) redrew the scrollbars (~3 ms)."""
        seen = (size, virtual_size, container_size, self.virtual_size, self.styles.gutter)
        if seen == self._sizes_seen:
            return self.container_size != container_size  # what ScrollView returns for the same sizes again
        self._sizes_seen = seen
        return super()._size_updated(size, virtual_size, container_size, layout)

    def _update_dimensions(self, new_rows: Iterable[RowKey]) -> None:
        """DataTable's, for one-line rows without labels: widen the columns for the new rows' cells, then set the
        virtual size (the height is the row count)."""
        self._widen(new_rows)
        width = sum(column.get_render_width(self) for column in self.columns.values()) + self._row_label_column_width
        self.virtual_size = Size(width, len(self.rows) + (self.header_height if self.show_header else 0))

    def _widen(self, row_keys: Iterable[RowKey]) -> None:
        """Widen the columns for these rows' cells."""
        columns = self.ordered_columns
        data, measure_cell = self._data, self._measure_cell
        for row_key in row_keys:
            row = data.get(row_key)
            if row is None:  # removed before the table was idle
                continue
            for column in columns:
                value = row.get(column.key)
                if value is not None:
                    column.content_width = max(column.content_width, measure_cell(value))

    def remove_rows(self, keys: Collection[str]) -> None:
        """Remove many rows at once, re-indexing the rest once (``DataTable.remove_row`` re-indexes every row on each
        call). The cursor keeps its index, clamped (:meth:`apply` moves it back onto its task)."""
        if not keys:
            return
        gone = set(keys)
        locations = self._row_locations
        order = list(map(locations._reverse.__getitem__, range(len(locations))))
        kept: list[RowKey] = []
        start = 0
        for index in sorted(i for i in map(locations.get, gone) if i is not None):  # type: ignore[arg-type]
            kept += order[start:index]  # the rows between two removed ones, one slice at a time
            start = index + 1
        kept += order[start:]
        self._row_locations = _row_index(kept)
        rows, data, updated_cells, shown = self.rows, self._data, self._updated_cells, self._rows
        for key in gone:
            row = data.pop(key, None)  # type: ignore[call-overload]  # RowKey hashes and compares like its str
            rows.pop(key, None)  # type: ignore[call-overload]
            shown.pop(key, None)
            if updated_cells and row is not None:
                for column_key in row:
                    updated_cells.discard(CellKey(RowKey(key), column_key))
        self._require_update_dimensions = True
        self._update_count += 1
        self.cursor_coordinate = self.cursor_coordinate  # clamps to the last row
        self.check_idle()
        self.refresh(layout=True)

    def remove_row(self, row_key: RowKey | str) -> None:
        """As DataTable's (RowDoesNotExist for an unknown key), through :meth:`remove_rows`."""
        if row_key not in self._row_locations:
            raise RowDoesNotExist(f"Row key {row_key!r} is not valid.")
        self.remove_rows([row_key.value if isinstance(row_key, RowKey) and row_key.value else str(row_key)])

    def clear(self, columns: bool = False) -> Self:
        self._rows.clear()
        return super().clear(columns)

    def append_rows(self, rows: list[tuple[str, tuple[str, ...]]]) -> None:
        """``add_row`` for many rows, with one cursor check and one idle request instead of one per row; the
        columns are widened for the new cells at once."""
        if not rows:
            return
        was_empty = not self.rows
        locations, data, table_rows = self._row_locations, self._data, self.rows
        appended: list[RowKey] = []
        column_keys = [column.key for column in self.ordered_columns]
        index = len(table_rows)
        for key, row_cells in rows:
            row_key = RowKey(key)
            if row_key in locations:
                raise DuplicateKey(f"The row key {row_key!r} already exists.")
            locations[row_key] = index
            data[row_key] = row_data = dict(zip(column_keys, row_cells, strict=True))
            table_rows[row_key] = Row(row_key, 1, None, False)
            appended.append(row_key)
            self._rows[key] = _Shown(row_cells[3], row_cells[4], row_data)
            index += 1
        # Columns widen now, not when the table is next idle (DataTable's way): a frame painted in between, on a
        # busy machine, showed header-wide columns. The idle update still sets the virtual size.
        self._widen(appended)
        self._require_update_dimensions = True
        self.cursor_coordinate = self.cursor_coordinate
        if was_empty and self.columns and self.show_cursor and self.cursor_type != "none":
            self._highlight_cursor()  # as add_row does for the first row
        self._update_count += 1
        self.check_idle()

    def apply(self, tasks: Iterable[TaskInfo]) -> tuple[int, int, int]:
        """Make the rows match ``tasks`` (after the filter): new tasks are appended, finished ones removed, and the
        State / Running for cells of the others updated where their text changed. The cursor stays on its task.
        Returns (added, updated, removed)."""
        tasks = tasks if isinstance(tasks, tuple | list) else list(tasks)
        shown, needle = self._rows, self.filter
        # The filter reads worker, name and id, which a task id keeps: rows shown under the same filter still match.
        same_filter = needle == self._filtered_by
        self._filtered_by = needle
        state_column, running_column = self._column_keys["state"], self._column_keys["running"]
        get = shown.get
        kept: list[str] = []  # rows kept, when the filter changed
        fresh: dict[str, TaskInfo] = {}
        updated = 0
        ids = list(map(_task_id, tasks))
        for key, task, old in zip(ids, tasks, map(get, ids), strict=True):
            if old is None or not same_filter:
                if needle and not matches(task, needle):
                    continue
                if old is None:
                    fresh[key] = task  # a task reported twice: its last report, as for shown rows
                    continue
                kept.append(key)
            state, runtime = task.state, task.runtime
            if state == "active" and runtime is not None:
                if old.low < runtime < old.high:
                    continue  # the text holds for this runtime (the row shows an active task: see _Shown)
                seconds = round(runtime)
                if seconds < 0:
                    seconds = 0
                if old.since <= seconds < old.until and state == old.state:
                    continue
                running, old.until = natural_span(seconds)
                old.since = seconds
                # round(x) is in [since, until) for every x strictly between since - 0.5 and until - 0.5
                old.low, old.high = seconds - 0.5, old.until - 0.5
                old.shown_for = None
            else:
                shown_for = (state, task.eta)  # the text depends on nothing else here
                if shown_for == old.shown_for:
                    continue
                running = running_for(task)
                old.since = old.until = 0
                old.low = old.high = 0.0
                old.shown_for = shown_for
            if running != old.running or state != old.state:
                # As update_cell() does, minus one refresh per cell: one refresh for the whole update below.
                old.cells[running_column] = old.running = running
                if state != old.state:
                    old.cells[state_column] = old.state = state
                updated += 1
        removed = shown.keys() - (set(ids) if same_filter else set(kept))
        cursor_key = self._row_locations.get_key(self.cursor_row) if removed and shown else None
        self.remove_rows(removed)
        self.append_rows([(key, cells(task)) for key, task in fresh.items()])
        if cursor_key is not None:
            index = self._row_locations.get(cursor_key)
            if index is not None and index != self.cursor_row:
                self.cursor_coordinate = Coordinate(index, self.cursor_column)
        if updated:
            self._update_count += 1  # the render caches are keyed by it
        if updated or fresh:
            self.refresh()
        return len(fresh), updated, len(removed)


def _row_index(order: list[RowKey]) -> TwoWayDict[RowKey, int]:
    """DataTable's row index (row key <-> index) for rows in this order. Its forward map is keyed by each key's str
    (a RowKey finds the same entry: same hash, and they compare equal): a RowKey hashes in Python code, 10,000 of
    them ~4 ms, where a str's hash is computed once and kept."""
    index: TwoWayDict[RowKey, int] = TwoWayDict({})
    index._forward = dict(zip(map(_key_value, order), range(len(order)), strict=True))  # type: ignore[arg-type]
    index._reverse = dict(enumerate(order))
    return index


class _RowFrame(NamedTuple):
    show_cursor: bool
    show_hover_cursor: bool
    fixed_rows: int
    widths: list[int]  # render width of each column
    filler: int  # cells right of the last column


class _Shown:
    """What a row shows of its task: State and Running for, the range of whole seconds of runtime over which that
    text holds (empty when not active), the same as an open range of runtimes (``low < runtime < high``: checked
    without rounding; empty unless the row shows an active task), for a task not running the (state, ETA) its text
    was made for, and the row's cells in the DataTable (updated in place)."""

    __slots__ = ("cells", "high", "low", "running", "shown_for", "since", "state", "until")

    def __init__(self, state: str, running: str, cells: dict[ColumnKey, Any]) -> None:
        self.state, self.running, self.cells = state, running, cells
        self.since = self.until = 0
        self.low = self.high = 0.0
        self.shown_for: tuple[str, str | None] | None = None
