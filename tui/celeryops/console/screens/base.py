"""What every console screen shares: the status bar, the footer, and the read-only rule for dangerous actions
(in watch mode they are not registered at all, and ``check_action`` refuses them as a second lock)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, ClassVar, TypeVar
from weakref import WeakSet

from rich.cells import cell_len
from rich.text import Text
from textual.binding import Binding, BindingsMap
from textual.screen import Screen
from textual.widgets import DataTable

from celeryops.console.csscache import keep_parsed_css
from celeryops.console.widgets.footer import ConsoleFooter
from celeryops.console.widgets.status_bar import StatusBar
from celeryops.core.errors import UserError
from celeryops.core.masking import mask_text

if TYPE_CHECKING:
    from celeryops.console.host import ConsoleHost
    from celeryops.console.model import RunModel


Row = tuple[str | None, Sequence[object]]  # (row key, cells)
T = TypeVar("T")


def _cell_width(value: object) -> int:
    return value.cell_len if isinstance(value, Text) else cell_len(str(value))


def refill(table: DataTable, rows: Sequence[Row], fit: str | None = None) -> None:
    """Replace every row of ``table``. The cursor stays on the row with the same key, the columns shrink back to
    their content, and the ``fit`` column (the last one) is cut with … to the width the others leave, so that
    nothing goes off-screen on a narrow terminal (its full text is elsewhere: a filter or another view)."""
    cursor_key = None
    if table.row_count and table.cursor_row < table.row_count:
        cursor_key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
    scroll_y = table.scroll_y
    table.clear()
    columns = list(table.columns.values())
    # Column widths are set here from the new rows, not left to DataTable's measuring when its queue is idle: a
    # frame painted before that (a busy machine, a screen just pushed) would show header-wide columns.
    widths = [max([column.label.cell_len, *(_cell_width(cells[i]) for _, cells in rows)])
              for i, column in enumerate(columns)]
    if fit is not None and table.size.width:
        index = [c.key.value for c in columns].index(fit)
        others = sum(w + 2 * table.cell_padding for i, w in enumerate(widths) if i != index)
        room = max(8, table.size.width - 1 - others - 2 * table.cell_padding)  # 1: the vertical scrollbar
        rows = [(key, [*cells[:index], _fitted(cells[index], room), *cells[index + 1:]]) for key, cells in rows]
        widths[index] = max(columns[index].label.cell_len, min(widths[index], room))
    for column, width in zip(columns, widths, strict=True):
        column.content_width = width
    for key, cells in rows:
        table.add_row(*cells, key=key)
    _scrollbars_follow(table)
    if cursor_key is not None and cursor_key in table.rows:
        table.move_cursor(row=table.get_row_index(cursor_key), scroll=False)
    if scroll_y:
        table.call_after_refresh(table.scroll_to, y=scroll_y, animate=False)


_FOLLOWED: WeakSet[DataTable] = WeakSet()


def _scrollbars_follow(table: DataTable) -> None:
    """Have ``table`` show or hide its scrollbars whenever its content's size changes.

    Textual decides a table's scrollbars when its region or container changes, and when only the content's size
    changes, not always: content that shrank to fit (the rows refilled after a resize to a narrower terminal, or
    filled before the table's first layout) could keep a horizontal scrollbar it no longer needs, and a table of
    ``height: auto`` then stays one line taller than its rows."""
    if table not in _FOLLOWED:
        _FOLLOWED.add(table)
        table.watch(table, "virtual_size", table._refresh_scrollbars, init=False)


def _fitted(value: object, width: int) -> object:
    if _cell_width(value) <= width:
        return value
    text = value.copy() if isinstance(value, Text) else Text(str(value))
    text.truncate(width, overflow="ellipsis")
    return text


def home_binding(screen: str, keys: str = "h,escape", tooltip: str = "Back to the fleet.") -> Binding:
    """The key of ``screen`` (its bindings' id prefix) back to the fleet: the home screen."""
    return Binding(keys, "app.show_home", "Home", id=f"{screen}.home", tooltip=tooltip)


class ConsoleScreen(Screen):
    """A full screen of the console."""

    VIEW_TITLE: ClassVar[str] = ""
    DANGEROUS: ClassVar[frozenset[str]] = frozenset()  # actions that change the fleet

    def __init__(self, read_only: bool, **kwargs) -> None:
        super().__init__(**kwargs)
        self.read_only = read_only
        self._footer_shown: tuple[object, ...] | None = None  # see refresh_footer
        if read_only and self.DANGEROUS:
            self._bindings = BindingsMap(b for _, b in self._bindings if b.action.split("(")[0] not in self.DANGEROUS)

    @property
    def console(self) -> ConsoleHost:
        """The application this screen runs in, as the protocol screens may use (no import of the app module)."""
        return self.app  # type: ignore[return-value]

    def status_bar(self) -> StatusBar:
        return StatusBar(self.console.backend.fleet_display, self.read_only, self.VIEW_TITLE)

    def footer(self) -> ConsoleFooter:
        return ConsoleFooter(show_command_palette=True)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (action in self.DANGEROUS and self.read_only)

    def refresh_footer(self) -> None:
        """``refresh_bindings()`` when the footer would show something else (a key enabled or disabled, added or
        gone): Textual's Footer rebuilds every key on each call (recompose, layout, repaint), and the console renders
        the run on every event, each drain poll included."""
        shown = tuple((key, *active) for key, active in self.active_bindings.items())
        if shown != self._footer_shown:
            self._footer_shown = shown
            self.refresh_bindings()

    def load(self, group: str, read: Callable[[], Awaitable[T]], show: Callable[[T | None, str], None]) -> None:
        """Read from the backend in a worker (the group's previous read is cancelled), then ``show(value, "")``, or
        ``show(None, error)`` with the error's sentence (passwords masked) when the read was refused."""
        async def reading() -> None:
            try:
                value = await read()
            except UserError as err:
                show(None, mask_text(str(err)))
            else:
                show(value, "")

        self.run_worker(reading(), group=group, exclusive=True)

    def render_model(self, model: RunModel) -> None:
        """Show the run as the model has it now (called on every run event while this screen is on top)."""

    def on_screen_resume(self) -> None:
        self.render_model(self.console.model)
        self.console.sync_view()
        self.call_after_refresh(keep_parsed_css, self.app.stylesheet)  # this screen's CSS, for the next start
