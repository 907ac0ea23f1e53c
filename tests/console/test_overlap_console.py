"""An overlap deploy driven through the console (issue 19, item 5): the real ops backend, the real google-cloud-run
client against the stand-in whose worker pool instances are real fence-plugin Celery workers, one real Redis. The
overlap screen shows both revisions side by side while the old one drains a task that is still running and the new
one completes a steady stream of short tasks; its footer keys do what they say; X retires the new revision."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from test_flows import SIZE, backend_for, console, press, proceed
from test_flows import until as app_until
from test_watch_monitor import watcher
from textual.widgets import DataTable

from celeryops.console.screens.confirm import ConfirmScreen
from celeryops.console.screens.home import HomeScreen
from celeryops.console.screens.overlap import OverlapScreen
from celeryops.console.screens.slots import SlotsScreen
from celeryops.console.widgets.task_table import TaskTable
from celeryops.core.configload import load_config
from celeryops.core.errors import EXIT_OK
from celeryops.ops.backend.console import OpsBackend
from celeryops.ops.journal import Journal
from celeryops_harness.taskapp import until as hold
from celeryops_harness.workers import wait_for
from clihelp import CliProcess
from drainhelp import runs, started
from overlaphelp import RELEASE, WAIT, Pool, Producer, all_finished, running_pool

pytestmark = pytest.mark.slow


def overlap_backend(pool: Pool) -> OpsBackend:
    config = load_config(str(pool.dir / "celeryops.toml"), pool.dir, {}, {"state_dir": str(pool.dir / "state")})
    targets = tuple(replace(t, strategy="overlap") for t in config.targets)  # as `deploy --strategy overlap`
    return backend_for(pool.redis_url, pool.dir / "state", config=config, repo=pool.git.work, targets=targets)


def cells(app: Any, role: str) -> list[str]:
    table = app.screen.query_one("#revisions", DataTable)
    return [str(cell) for cell in table.get_row(role)]


async def test_overlap_deploy_through_the_console(tmp_path: Path, redis_url: str, queue_name: str,
                                                  redis_client: redis.Redis) -> None:
    gate = f"{queue_name}:long"
    # max wait 150 s: on a loaded machine the new revision's two workers were seen not to consume within 60 s, and
    # the overlap then (rightly) retired it; the long task is held only until the test lets it go.
    with running_pool(tmp_path, redis_url, queue_name, interval=0.3, max_wait=150) as pool:
        with hold.app.connection_for_write(redis_url) as conn:
            long_id = hold.apply_async(args=(gate,), queue=queue_name, connection=conn).id
        await_started = lambda: started(redis_client, [long_id])  # noqa: E731
        backend = overlap_backend(pool)
        app = console(backend, start="deploy", release=RELEASE)
        try:
            with Producer(redis_url, queue_name) as producer:
                async with app.run_test(size=SIZE) as pilot:
                    await app_until(pilot, await_started, WAIT, "the long task to start on the old revision")
                    await app_until(pilot, lambda: app.model.preflight is not None, WAIT, "the preflight")
                    assert app.model.is_overlap and app.model.checks["fence"].status == "ok"
                    await app_until(pilot, lambda: app.model.may_proceed, WAIT, "the preflight to finish")
                    await press(pilot, "G")
                    await app_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
                    said = str(app.screen.query_one("#dialog-body").render())
                    assert "4 instances at the peak" in said and "Nothing is killed" in said, said
                    assert "Old and new code side by side" in said  # the mixed_versions warning, to accept
                    await press(pilot, "y")

                    # Both revisions side by side: the old one drains the long task, the new one completes tasks.
                    overlap = lambda: app.model.overlap  # noqa: E731
                    await app_until(pilot, lambda: overlap() is not None and overlap().step == "stopping_old"
                                    and app.model.progress is not None and app.model.progress.active >= 1,
                                    2 * WAIT, "the old revision's drain, held by the long task")
                    await app_until(pilot, lambda: (overlap().completed or 0) >= 3 and overlap().rate is not None,
                                    WAIT, "the new revision to complete tasks")
                    assert isinstance(app.screen, OverlapScreen)
                    old, new = overlap().old, overlap().new
                    assert (old, overlap().peak) == (pool.old, 2 * pool.count)
                    await app_until(pilot, lambda: cells(app, "new")[2:4] == ["2", "50%"], 10, "the rows")
                    assert cells(app, "old")[1:4] == [old, "2", "50%"], cells(app, "old")
                    assert "2 consume" in cells(app, "new")[5] and "/s" in cells(app, "new")[5], cells(app, "new")
                    tasks = app.screen.query_one(TaskTable)
                    assert any(long_id in str(key.value) for key in tasks.rows), list(tasks.rows)
                    assert pool.instances() == {old: 2, new: 2}  # nothing of the old revision taken away

                    # The footer's keys do what they say (the deploy goes on meanwhile).
                    await press(pilot, "s")
                    assert isinstance(app.screen, SlotsScreen)
                    await press(pilot, "h")
                    assert isinstance(app.screen, HomeScreen)
                    await press(pilot, "w")
                    assert isinstance(app.screen, OverlapScreen)
                    tasks = app.screen.query_one(TaskTable)  # the screen w opened (h left the other one)
                    await app_until(pilot, lambda: tasks.row_count >= 1, 10, "the old revision's tasks")
                    await press(pilot, "slash")
                    await pilot.press(*"zzz-no-such-task")
                    await app_until(pilot, lambda: tasks.row_count == 0, 10, "the filter to hide every task")
                    await press(pilot, "escape", "escape")
                    await app_until(pilot, lambda: tasks.row_count >= 1, 10, "the filter to be cleared")

                    redis_client.set(gate, 1)  # the long task ends: the old revision goes idle, the cutover follows
                    await app_until(pilot, lambda: app.model.phase == "done", 2 * WAIT, "the deploy to finish")
                    assert overlap().steps == ["planned", "scaling_up", "scaled_up", "consuming", "stopping_old",
                                               "old_idle", "cutting_over", "cut_over"]
                    await app_until(pilot, lambda: cells(app, "old")[4] == "gone", 10, "the rows after the cutover")
                    assert cells(app, "new")[2:4] == ["2", "100%"]
                    await press(pilot, "q")
                assert app.return_value == EXIT_OK
        finally:
            await backend.close()
            backend.close_sync()
        assert pool.instances() == {new: 2}
        all_finished(redis_client, [long_id, *producer.ids], "every task to finish")
        assert all(runs(redis_client, t)["runs"] == 1 for t in [long_id, *producer.ids])
        with Journal(state_dir=str(tmp_path / "state")) as journal:
            assert journal.unfinished_runs() == []


async def test_x_mid_overlap_retires_the_new_revision(tmp_path: Path, redis_url: str, queue_name: str,
                                                      redis_client: redis.Redis) -> None:
    """X while the old revision drains: the confirmation says what happens, then the old revision consumes again
    and the new one is retired: the pool is back on the old revision, nothing was killed."""
    gate = f"{queue_name}:long"
    with running_pool(tmp_path, redis_url, queue_name, interval=0.3, max_wait=150) as pool:  # see the first test
        with hold.app.connection_for_write(redis_url) as conn:
            long_id = hold.apply_async(args=(gate,), queue=queue_name, connection=conn).id
        backend = overlap_backend(pool)
        app = console(backend, start="deploy", release=RELEASE)
        try:
            async with app.run_test(size=SIZE) as pilot:
                await app_until(pilot, lambda: started(redis_client, [long_id]), WAIT, "the long task to start")
                await proceed(pilot)
                await app_until(pilot, lambda: app.model.overlap is not None and app.model.progress is not None
                                and app.model.progress.active >= 1, WAIT, "the old revision's drain")
                assert isinstance(app.screen, OverlapScreen)
                await press(pilot, "X")
                await app_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "the confirmation")
                said = str(app.screen.query_one("#dialog-body").render())
                assert "consume again first" in said and "Nothing is killed" in said, said
                await press(pilot, "y")
                redis_client.set(gate, 1)  # the old revision's task may end now: it runs on, nothing is killed
                await app_until(pilot, lambda: app.model.phase == "aborted", 2 * WAIT, "the new revision retired")
                assert app.model.overlap is not None and app.model.overlap.seen("retired")
                assert isinstance(app.screen, OverlapScreen)
                await press(pilot, "q")
        finally:
            await backend.close()
            backend.close_sync()
        assert pool.instances() == {pool.old: pool.count}
        all_finished(redis_client, [long_id], "the long task to finish")
        assert runs(redis_client, long_id)["runs"] == 1


async def test_watcher_follows_an_overlap_run_by_another_process(tmp_path: Path, redis_url: str, queue_name: str,
                                                                  redis_client: redis.Redis) -> None:
    """`celeryops deploy --strategy overlap --json` in another process, a read-only console following it: the
    watcher's overlap screen shows both revisions from the published events, without X or F."""
    gate = f"{queue_name}:long"
    with running_pool(tmp_path, redis_url, queue_name, interval=0.3, max_wait=150) as pool:  # see the first test
        with hold.app.connection_for_write(redis_url) as conn:
            long_id = hold.apply_async(args=(gate,), queue=queue_name, connection=conn).id
        wait_for(lambda: started(redis_client, [long_id]), WAIT, "the long task to start")
        proc = CliProcess(pool.args(), pool.env, cwd=pool.dir)
        backend, app = watcher(redis_url, tmp_path / "watcher", follow_interval=0.2)
        try:
            proc.wait_event("poll", WAIT, where=lambda e: e["active"] >= 1)  # the old revision stopped, busy
            async with app.run_test(size=SIZE) as pilot:
                await app_until(pilot, lambda: isinstance(app.screen, OverlapScreen) and app.model.overlap is not None
                                and app.model.overlap.step == "stopping_old" and app.model.progress is not None,
                                WAIT, "the watcher to show the overlap")
                overlap = app.model.overlap
                assert overlap is not None and overlap.old == pool.old
                await app_until(pilot, lambda: cells(app, "new")[2:4] == ["2", "50%"], WAIT, "the new revision's row")
                assert cells(app, "old")[1:4] == [pool.old, "2", "50%"]
                assert not {"X", "F"} & {b.key for _, b in app.screen._bindings}
                redis_client.set(gate, 1)
                await app_until(pilot, lambda: overlap.seen("cut_over"), 2 * WAIT, "the cutover, as published")
                await press(pilot, "q")
            assert proc.finish(120) == 0, proc.read_stderr()
        finally:
            redis_client.set(gate, 1)
            proc.kill()
            await backend.close()
            backend.close_sync()
        assert pool.instances() == {overlap.new: 2}
