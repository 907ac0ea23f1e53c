"""The task table's shortcuts give what Textual's DataTable gives: the same rows, cells, column widths, size and
rendered lines as a plain DataTable driven through its public API (add_row / update_cell / remove_row, texts through
humanize) over a run of polls; the cursor stays on its task; filters and duplicates behave."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.render import measure
from textual.widgets import DataTable
from textual.widgets._data_table import default_cell_formatter

from celeryops.console import fmt
from celeryops.console.widgets.task_table import COLUMNS, TaskTable, eta_text, matches, plain_width
from celeryops.core.events import TaskInfo

ODD_TEXTS = ("[bold]marked[/]", "emoji :smile: and :+1:", "a: b", "wide 任务名", "tab\there", "  spaced  out ",
             "line\nbreak", "\\[escaped]", "", "x" * 70)


def test_eta_is_a_short_utc_time_whatever_celery_sent() -> None:
    assert eta_text("2026-12-02T23:30:05.123456+00:00") == "ETA Dec 02 23:30 UTC"
    assert eta_text("2026-12-03T08:30:05+09:00") == "ETA Dec 02 23:30 UTC"
    assert eta_text("2026-12-02T23:30:05") == "ETA Dec 02 23:30 UTC"  # naive: Celery's UTC
    assert eta_text("+35 min") == "ETA +35 min"  # not an ISO time: as it came


@settings(max_examples=2000, deadline=None)  # correctness, not speed: one example may wait for a core under load
@given(st.text())
def test_plain_width_is_what_datatable_measures(text: str) -> None:
    width = plain_width(text)
    if width is not None:
        assert width == measure(Console(), default_cell_formatter(text, wrap=False, height=1), 1)


def test_plain_width_declines_markup_emoji_codes_and_control_characters() -> None:
    assert plain_width("(1, 'gs://bucket/x.mp4')") == 24  # one colon cannot be an emoji code
    for text in ("[b]x", ":smile: :x:", "a\nb", "a\tb", "\x1b[1m"):
        assert plain_width(text) is None


def reference_cells(task: TaskInfo) -> tuple[str, ...]:
    """A row as the table showed it through humanize (fmt.since) before the shortcuts."""
    running = fmt.since(task.runtime) if task.state == "active" else f"ETA {task.eta}" if task.eta else "-"
    return (task.worker, task.name, task.id[:8], task.state, running, fmt.shorten(task.args, 30))


def mirror(reference: DataTable[Any], tasks: list[TaskInfo], needle: str) -> None:
    """What TaskTable.apply does, through DataTable's public API one row and one cell at a time."""
    wanted: dict[str, TaskInfo] = {}
    for task in tasks:
        if matches(task, needle):
            wanted[task.id] = task  # a task reported twice: its last report
    for key in [row_key.value for row_key in reference.rows if row_key.value not in wanted]:
        assert key is not None
        reference.remove_row(key)
    for key, task in wanted.items():
        row = reference_cells(task)
        if key in reference.rows:
            reference.update_cell(key, "state", row[3])
            reference.update_cell(key, "running", row[4])
        else:
            reference.add_row(*row, key=key)


class Tables(App[None]):
    AUTO_FOCUS = None
    CSS = "DataTable { height: 12; }"

    def compose(self) -> ComposeResult:
        yield TaskTable(id="fast")
        yield DataTable(id="reference", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        reference = self.query_one("#reference", DataTable)
        for key, label in COLUMNS:
            reference.add_column(label, key=key)


def task(rng: random.Random, n: int) -> TaskInfo:
    state = rng.choice(("active", "active", "active", "reserved", "scheduled"))
    odd = rng.random() < 0.15
    return TaskInfo(
        worker=rng.choice(ODD_TEXTS) if odd else f"celery@worker-{n % 5}", id=f"{n:06d}-{rng.randrange(10**6):06d}",
        name=rng.choice(("media.render_video", "ml.embed_batch", "etl.load")), state=state,  # type: ignore[arg-type]
        args=rng.choice(ODD_TEXTS) if odd else f"({n}, 'gs://bucket/{n}.mp4')",
        runtime=rng.uniform(-1, 5000) if state == "active" and rng.random() > 0.05 else None,
        eta="+35 min" if state == "scheduled" else None)


def next_poll(rng: random.Random, tasks: list[TaskInfo], serial: int) -> list[TaskInfo]:
    """Some tasks finish (anywhere), some start, runtimes grow (some a lot), a reserved one starts, a duplicate id."""
    kept = [t for t in tasks if rng.random() > 0.1]
    grown = []
    for t in kept:
        if t.state == "active" and t.runtime is not None:
            t = replace(t, runtime=t.runtime + rng.choice((0.4, 15.0, 61.0, 3600.0, 2 * 86_400.0, 600 * 86_400.0)))
        elif t.state == "reserved" and rng.random() < 0.3:
            t = replace(t, state="active", runtime=rng.uniform(0, 3))
        grown.append(t)
    grown += [task(rng, serial * 1000 + i) for i in range(rng.randrange(0, 8))]
    if grown:
        grown.append(grown[rng.randrange(len(grown))])
    return grown


def rendered(table: DataTable[Any]) -> list[list[tuple[str, Any]]]:
    width, height = table.size
    return [[(segment.text, segment.style) for segment in strip.simplify()]
            for strip in table.render_lines(Region(0, 0, width, height))]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_task_table_matches_a_plain_datatable(seed: int) -> None:
    rng = random.Random(seed)
    app = Tables()
    async with app.run_test(size=(110, 30)) as pilot:
        fast, reference = app.query_one(TaskTable), app.query_one("#reference", DataTable)
        tasks = [task(rng, n) for n in range(40)]
        for serial in range(1, 13):
            needle = "worker-1" if serial in (5, 6) else "render" if serial == 9 else ""
            fast.filter = needle
            fast.apply(tasks)
            mirror(reference, tasks, needle)
            reference.move_cursor(row=fast.cursor_row)
            await pilot.pause()
            order = [row.key.value for row in DataTable.ordered_rows.fget(fast)]  # type: ignore[attr-defined]
            assert [row.key.value for row in fast.ordered_rows] == order
            assert order == [row.key.value for row in reference.ordered_rows]
            assert [fast._y_offsets[y] for y in range(len(fast._y_offsets))] == reference._y_offsets
            for key in order:
                assert fast.get_row(key) == reference.get_row(key)
            assert [c.content_width for c in fast.ordered_columns] == [
                c.content_width for c in reference.ordered_columns]
            assert fast.virtual_size == reference.virtual_size
            for scroll in (0, max(0, fast.row_count // 2)):
                fast.scroll_to(y=scroll, animate=False, immediate=True)
                reference.scroll_to(y=scroll, animate=False, immediate=True)
                assert rendered(fast) == rendered(reference), (seed, serial, scroll)
            if serial in (4, 8) and fast.row_count > 3:  # focused (cursor styles change), the mouse over a row
                shown = []
                for table in (fast, reference):
                    table.focus()
                    await pilot.pause()
                    await pilot.hover(table, offset=(5, 3))
                    await pilot.pause()
                    shown.append(rendered(table))
                await pilot.hover(None, offset=(0, 29))  # below both tables
                app.set_focus(None)
                await pilot.pause()
                assert shown[0] == shown[1], (seed, serial, "focused and hovered")
            fast.scroll_to(y=0, animate=False, immediate=True)
            reference.scroll_to(y=0, animate=False, immediate=True)
            tasks = next_poll(rng, tasks, serial)


def sample_tasks(n: int) -> list[TaskInfo]:
    return [TaskInfo(worker=f"celery@w{i % 3}", id=f"task-{i:04d}", name="media.render_video", state="active",
                     runtime=60.0 * i) for i in range(n)]


async def test_cursor_stays_on_its_task_when_rows_above_finish() -> None:
    app = Tables()
    async with app.run_test(size=(110, 30)) as pilot:
        table = app.query_one(TaskTable)
        tasks = sample_tasks(30)
        table.apply(tasks)
        await pilot.pause()
        table.move_cursor(row=10)
        await pilot.pause()
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == "task-0010"
        table.apply([t for i, t in enumerate(tasks) if i not in (0, 3, 7, 20)])  # three above, one below
        await pilot.pause()
        assert table.cursor_row == 7
        assert table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value == "task-0010"
        table.apply([t for t in tasks if t.id != "task-0010"][:12])  # its task finished: the cursor keeps its place
        await pilot.pause()
        assert table.cursor_row == 7


async def test_filter_duplicates_and_counts() -> None:
    app = Tables()
    async with app.run_test(size=(110, 30)) as pilot:
        table = app.query_one(TaskTable)
        tasks = sample_tasks(9)
        assert table.apply([*tasks, tasks[2]]) == (9, 0, 0)  # a task reported twice is one row
        table.filter = "w1"
        assert table.apply(tasks) == (0, 0, 6)
        assert {key.value for key in table.rows} == {"task-0001", "task-0004", "task-0007"}
        grown = [replace(t, runtime=(t.runtime or 0) + 60) for t in tasks]
        assert table.apply(grown) == (0, 3, 0)
        assert table.get_cell("task-0004", "running") == fmt.since(grown[4].runtime)
        table.filter = ""
        assert table.apply(grown) == (6, 0, 0)
        await pilot.pause()
        assert table.row_count == 9
        table.remove_row("task-0000")  # DataTable's own calls keep the table's record of its rows
        assert table.apply(grown) == (1, 0, 0)
        table.clear()
        assert table.apply(grown) == (9, 0, 0)
        await pilot.pause()
        assert [key.value for key in table.rows] == [t.id for t in grown]
        with pytest.raises(ValueError):
            table.add_row("a", "b", "c", "d", "e", "f", key="tall", height=2)
