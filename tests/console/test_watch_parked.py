"""Watch mode after a drain-only run: the run ends in phase ``drained`` with its consumers left stopped and its lease
given back. A watcher must say so (phase drained, the run parked on the home view), not keep showing 'draining' nor
'no run in progress' while every worker consumes nothing."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis
from rich.text import Text
from test_watch_monitor import watcher  # tests/console is on sys.path
from textual.widgets import Static

from celeryops.console.screens.home import HomeScreen
from celeryops.ops.fleetwide.publish import Publisher


async def test_watcher_shows_a_parked_drained_run(redis_url: str, start_workers: Any, queue_name: str,
                                                  tmp_path: Path) -> None:
    start_workers(redis_url, n=1, queues=[queue_name])
    writer = redis.Redis.from_url(redis_url)
    pub = Publisher(writer, "default", run_id="run-parked", owner="alice", host="box1", release=None,
                    started_at=time.time() - 90, phase="preflight")
    for phase in ("stopping", "draining"):
        pub.phase(phase)
    pub.event("started", {"queues": [queue_name], "workers": [], "streak": 3, "interval": 0.3, "max_wait": 60})
    pub.phase("drained")
    pub.flush(True)  # what a drain-only run leaves when it ends drained: no lease, no writer any more
    writer.close()

    backend, console = watcher(redis_url, tmp_path / "watcher", follow_interval=0.1)
    try:
        async with console.run_test(size=(120, 40)) as pilot:
            home = console.screen_stack[0]
            assert isinstance(home, HomeScreen)
            deadline = time.monotonic() + 60
            while not (console.model.phase == "drained" and home.fleet is not None and home.fleet.run is not None):
                assert time.monotonic() < deadline, (console.model.phase, home.fleet)
                await pilot.pause(0.05)
            assert console.model.kind == "drain" and console.model.release is None
            assert not console.model.active  # parked: no 'no update for N' badge, quitting does not ask
            assert home.fleet.run.run_id == "run-parked" and home.fleet.run.phase == "drained"
            banner = home.query_one("#run-banner", Static).render()
            text = banner.plain if isinstance(banner, Text) else str(banner)
            assert "drained" in text and "consumers stopped until a deploy or an abort" in text, text
            assert any("following run run-parked of alice@box1" in line.text for line in console.model.log)
            await pilot.press("q")
        assert console.return_value == 0
    finally:
        await backend.close()
        backend.close_sync()
