"""The slots view against the real Redis slot store and real slot-gated Celery workers (celeryops_harness.slotapp):
every pool is shown (each host's first, with a row per GPU device: held by which task, or free; then the global
pool of a shared type with its hosts' contributions), a type with no capacity reads 'none', and the holders and
waiters carry their task name, worker and age."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from test_flows import backend_for, console, press, until
from textual.widgets import DataTable

from celeryops.console.fmt import gauge
from celeryops.console.screens.slots import SlotsScreen
from celeryops.ops.backend.console import OpsBackend
from celeryops_harness.slotapp import send, slot_gpu, slot_hold
from celeryops_harness.taskapp import release

BASE = {"CELERYOPS_SLOTS_DETECT": "0", "CELERYOPS_TEST_SLOT_COUNTDOWN": "0.3", "CELERYOPS_SLOTS_LEASE_TTL": "5"}


async def test_every_pool_with_devices_holders_waiters_and_no_capacity_types(
        tmp_path: Path, redis_url: str, redis_client: Any, start_workers: Any, queue_name: str) -> None:
    q_gpu, q_shared = f"{queue_name}-h", f"{queue_name}-g"
    (gpu_worker,) = start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=3, queues=[q_gpu],
                                  env={**BASE, "CELERYOPS_SLOTS_HOST": "host-a", "CELERYOPS_SLOTS_CPU": "2",
                                       "CELERYOPS_SLOTS_GPU": "2"})
    (shared_worker,) = start_workers(redis_url, app="celeryops_harness.slotapp", concurrency=2, queues=[q_shared],
                                     env={**BASE, "CELERYOPS_SLOTS_HOST": "host-b", "CELERYOPS_SLOTS_CPU": "4",
                                          "CELERYOPS_SLOTS_GPU": "0", "CELERYOPS_SLOTS_SHARED": "cpu"})
    held = {send(slot_gpu, redis_url, q_gpu, 0.0, f"gpu {i}", gate=q_gpu) for i in range(2)}  # host-a's 2
    send(slot_gpu, redis_url, q_gpu, 0.0, "waits on host-a", gate=q_gpu)
    send(slot_hold, redis_url, q_shared, q_shared, "holds shared cpu")  # until released
    backend: OpsBackend = backend_for(redis_url, tmp_path / "state")
    try:
        deadline = time.monotonic() + 60
        while True:
            view = await backend.slots_snapshot()
            if view is not None and len(view.pools) >= 3 and len(view.holders) >= 3 and view.waiting:
                break
            assert time.monotonic() < deadline, f"the pools never showed the holders and a waiter: {view}"
            await asyncio.sleep(0.2)
        assert [p.name for p in view.pools] == ["host:host-a", "host:host-b", "global"], "hosts first"
        host_a, host_b, shared = view.pools
        assert host_a.scope == "host" and host_a.host == "host-a"
        res = {r.name: r for r in host_a.resources}
        assert (res["cpu"].total, res["cpu"].used, res["gpu"].total, res["gpu"].used) == (2, 2, 2, 2)
        assert [(d.type, d.device, d.task, d.worker) for d in host_a.devices] == [
            ("gpu", "0", "celeryops.testing.slot_gpu", gpu_worker.nodename),
            ("gpu", "1", "celeryops.testing.slot_gpu", gpu_worker.nodename)]
        assert {d.lease_id for d in host_a.devices} == held and all(d.held_for >= 0 for d in host_a.devices)
        holder = host_a.holders[0]
        assert holder.task == "celeryops.testing.slot_gpu" and holder.worker == gpu_worker.nodename
        assert holder.slots == {"cpu": 1, "gpu": 1} and holder.devices["gpu"][0] in ("0", "1")
        assert holder.age >= 0 and not holder.expired
        waiter = host_a.waiting[0]
        assert waiter.task == "celeryops.testing.slot_gpu" and waiter.worker == gpu_worker.nodename
        assert not waiter.no_capacity  # host-a has 2 GPUs: it only has to wait
        gpu = {r.name: r for r in host_b.resources}["gpu"]  # CELERYOPS_SLOTS_GPU=0: no capacity
        assert (gpu.total, gpu.used) == (0, 0) and host_b.devices == ()
        assert gauge(gpu.name, gpu.used, gpu.total, 10).plain.endswith("none")
        assert "full" not in gauge(gpu.name, gpu.used, gpu.total, 10).plain
        # the global pool's capacity is its hosts' contributions of the shared type: host-b's 4 cpu
        assert shared.scope == "global" and {r.name: r.total for r in shared.resources} == {"cpu": 4}
        assert shared.holders[0].worker == shared_worker.nodename
        assert [(h.host, h.totals, h.workers) for h in shared.hosts] == [
            ("host-b", {"cpu": 4}, (shared_worker.nodename,))]

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
            assert titles[0].startswith(f"host host-a · {gpu_worker.nodename}"), titles
            assert any(t.startswith("pool global · shared · 1 host: host-b") for t in titles), titles
            devices = [str(w.render()) for w in screen.query(".device")]
            assert len(devices) == 2 and all(f"■ celeryops.testing.slot_gpu · {gpu_worker.nodename}" in d
                                             for d in devices), devices
            holders = screen.query_one("#holders")
            assert holders.row_count >= 3
    finally:
        release(redis_client, q_gpu)
        release(redis_client, q_shared)
        await backend.close()
        backend.close_sync()
