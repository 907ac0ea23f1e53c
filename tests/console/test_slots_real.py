"""The slots view against the real Redis slot store and real slot-gated Celery workers (celeryops_harness.slotapp):
every pool is shown (the global one with its hosts' contributions, a per-host one), a type with no capacity reads
'none', and the holders and waiters carry their task name, worker and age."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from test_flows import backend_for, console, press, until
from textual.widgets import DataTable

from celeryops.console.fmt import gauge
from celeryops.console.screens.slots import SlotsScreen
from celeryops.ops.console_backend import OpsBackend
from celeryops_harness.slotapp import slot_hold
from celeryops_harness.taskapp import release

BASE = {"CELERYOPS_SLOTS_DETECT": "0", "CELERYOPS_TEST_SLOT_COUNTDOWN": "0.3", "CELERYOPS_SLOTS_LEASE_TTL": "5",
        "CELERYOPS_SLOTS_GPU": "0"}


def send(broker: str, queue: str, tag: str) -> str:
    """A task that holds (or waits for) 2 cpu slots until the test ends (gate: the queue's name)."""
    with slot_hold.app.connection_for_write(broker) as conn:
        return str(slot_hold.apply_async(args=(queue, tag), queue=queue, connection=conn).id)


async def test_every_pool_with_holders_waiters_and_no_capacity_types(
        tmp_path: Path, redis_url: str, redis_client: Any, start_workers: Any, queue_name: str) -> None:
    q_host, q_global = f"{queue_name}-h", f"{queue_name}-g"
    (host_worker,) = start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=2, queues=[q_host],
                                   env={**BASE, "CELERYOPS_SLOTS_SCOPE": "host", "CELERYOPS_SLOTS_HOST": "host-a",
                                        "CELERYOPS_SLOTS_CPU": "2"})
    (global_worker,) = start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=2, queues=[q_global],
                                     env={**BASE, "CELERYOPS_SLOTS_HOST": "host-b", "CELERYOPS_SLOTS_CPU": "4"})
    send(redis_url, q_host, "holds host-a")  # 2 cpu of host-a's 2: the next one waits
    send(redis_url, q_host, "waits on host-a")
    send(redis_url, q_global, "holds global")
    backend: OpsBackend = backend_for(redis_url, tmp_path / "state")
    try:
        deadline = time.monotonic() + 60
        while True:
            view = await backend.slots_snapshot()
            if view is not None and len(view.pools) >= 2 and len(view.holders) >= 2 and view.waiting:
                break
            assert time.monotonic() < deadline, f"the pools never showed both holders and a waiter: {view}"
            await asyncio.sleep(0.2)
        scopes = {p.name: p for p in view.pools}
        host_pool = next(p for p in view.pools if p.scope == "host")
        global_pool = next(p for p in view.pools if p.scope == "global")
        assert view.pools[0] is global_pool, "the global pool comes first"
        assert host_pool.host == "host-a" and len(scopes) == 2
        cpu = {r.name: r for r in host_pool.resources}["cpu"]
        assert (cpu.total, cpu.used) == (2, 2)
        assert {r.name: r.total for r in global_pool.resources}.get("cpu") == 4
        holder = next(h for h in host_pool.holders)
        assert holder.task == "celeryops.testing.slot_hold" and holder.worker == host_worker.nodename
        assert holder.slots == {"cpu": 2} and holder.age >= 0 and not holder.expired
        waiter = host_pool.waiting[0]
        assert waiter.task == "celeryops.testing.slot_hold" and waiter.worker == host_worker.nodename
        assert global_pool.holders[0].worker == global_worker.nodename
        gpu = {r.name: r for r in host_pool.resources}["gpu"]  # CELERYOPS_SLOTS_GPU=0: no capacity
        assert (gpu.total, gpu.used) == (0, 0)
        assert gauge(gpu.name, gpu.used, gpu.total, 10).plain.endswith("none")
        assert "full" not in gauge(gpu.name, gpu.used, gpu.total, 10).plain
        # the global pool's capacity is its hosts' contributions: host-b's 4 cpu, renewed by its worker
        assert [(h.host, h.totals, h.workers) for h in global_pool.hosts] == [
            ("host-b", {"cpu": 4}, (global_worker.nodename,))]

        app = console(backend)
        async with app.run_test(size=(120, 40)) as pilot:
            await press(pilot, "s")
            # show_slots sets the view first, then mounts the gauges and fills the tables; the waiting table
            # (never empty: rows or "nobody is waiting") is filled last.
            await until(pilot, lambda: isinstance(app.screen, SlotsScreen) and app.screen.view is not None
                        and app.screen.query_one("#waiting", DataTable).row_count > 0, 30,
                        "the slots screen to show a snapshot")
            screen = app.screen
            assert isinstance(screen, SlotsScreen)
            titles = [str(w.render()) for w in screen.query(".pool-title")]
            assert any("pool " + global_pool.name in t and "global" in t for t in titles), titles
            assert any(host_pool.name in t and "host" in t for t in titles), titles
            holders = screen.query_one("#holders")
            assert holders.row_count >= 2
    finally:
        release(redis_client, q_host)
        release(redis_client, q_global)
        await backend.close()
        backend.close_sync()
