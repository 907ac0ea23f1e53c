"""Issue 36: the autoscaler's published status in the fleet's Redis (written by the loop, read by ``status`` and the
console), and its screen in ``celeryops watch``: read-only, nothing written; the plot of demand against capacity."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from celery import Celery

from celeryops.console import samplescale
from celeryops.console.app import make_app
from celeryops.console.screens.autoscale import AutoscaleScreen, summary
from celeryops.console.widgets.scaleplot import plot_lines
from celeryops.core.config import Config
from celeryops.core.untrusted import MalformedRecord
from celeryops.ops.backend.console import open_backend
from celeryops.ops.fleetwide.scalestatus import publish_scale_status, read_scale_status, scale_key


def test_published_status_reads_back_masked(redis_client: redis.Redis) -> None:
    status = samplescale.status()
    publish_scale_status(redis_client, status)
    assert read_scale_status(redis_client, "default") == status
    assert 0 < redis_client.ttl(scale_key("default")) <= 24 * 3600
    from dataclasses import replace

    publish_scale_status(redis_client, replace(status, message="redis://:hunter2@broker:6379/0 went away"))
    assert "hunter2" not in str(redis_client.hget(scale_key("default"), "status"))
    assert read_scale_status(redis_client, "other") is None


def test_a_malformed_status_is_named_not_trusted(redis_client: redis.Redis) -> None:
    redis_client.hset(scale_key("default"), "status", "[1, 2]")
    with pytest.raises(MalformedRecord, match="malformed or foreign autoscaler status"):
        read_scale_status(redis_client, "default")


def test_alive_stale_and_stopped() -> None:
    from dataclasses import replace

    status = replace(samplescale.status(), updated_at=time.time(), host="not-this-host")
    assert status.alive() and not status.stale()
    assert not replace(status, updated_at=time.time() - 120).alive()
    assert not replace(status, state="stopped").alive()
    import os
    import socket

    assert status.alive() and not replace(status, host=socket.gethostname(), pid=2 ** 22 + os.getpid()).alive()
    assert "running on not-this-host" in summary(status, time.time()).plain


def test_plot_puts_demand_and_capacity_on_one_scale() -> None:
    lines = [line.plain for line in plot_lines([(0.0, 0, 4), (1.0, 2, 4), (2.0, 4, 4), (3.0, 8, 4)], 12, 4)]
    assert len(lines) == 4 and all(len(line) == 12 for line in lines)
    assert lines[0].startswith("    8│") and lines[-1].startswith("    0│")
    columns = [[line[8 + i] for line in lines] for i in range(4)]  # 6 columns of looks: 2 empty, then the 4
    assert columns[0] == [" ", "━", " ", " "]  # capacity 4 of 8 over 4 rows: the line on row 2 from the bottom
    assert columns[3] == ["█", "█", "█", "█"]  # demand 8: a full bar, over the capacity line
    assert columns[2][-1] == "█" and columns[2][1] == "━"


@pytest.mark.slow
async def test_watch_shows_the_autoscaler_and_writes_nothing(redis_url: str, redis_client: redis.Redis,
                                                             tmp_path: Path) -> None:
    publish_scale_status(redis_client, samplescale.status())
    before = {k: redis_client.dump(k) for k in redis_client.keys("*")}
    app = Celery("watcher", broker=redis_url, set_as_current=False)
    backend = open_backend(app, Config(broker=redis_url), read_only=True, fleet_display="watched fleet",
                           state_dir=str(tmp_path / "watcher"), follow_interval=0.2)
    console = make_app(backend, animate=False, poll_interval=0.3)
    try:
        async with console.run_test(size=(100, 30)) as pilot:
            await pilot.press("a")
            deadline = time.monotonic() + 30
            while not (isinstance(console.screen, AutoscaleScreen) and console.screen.status is not None):
                assert time.monotonic() < deadline, "the watcher never showed the autoscaler"
                await pilot.pause(0.05)
            assert console.screen.status == samplescale.status()
            await pilot.press("q")
    finally:
        await backend.close()
        backend.close_sync()
    assert {k: redis_client.dump(k) for k in redis_client.keys("*")} == before
