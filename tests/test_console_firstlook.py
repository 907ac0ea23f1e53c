"""Issue 34: the console's first look at its fleet, read by a child process while the console starts
(``commands.firstlook``, ``ops.backend.firstlook``).

- the first look reads what the console backend's first poll reads but the doctor's findings (a real redis-server,
  real Celery workers), and loads none of the run session, deploy adapters, doctor, Google or gRPC to do it (what
  keeps it fast); the console polls again as soon as its own backend is open (the findings);
- the console's backend serves each part once, as the backend would have returned or raised it, then opens itself
  and goes on from what the child saw (its queues); the child is reaped, nothing of it reaches the terminal;
- whatever the child could not send (it failed, it hangs, a thread runs here so no fork) the console reads itself.

The forking tests run in a fresh interpreter of their own (a test process may run threads, and the first look
never forks beside a thread).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from celery import Celery

from celeryops.commands.firstlook import CPU_PRESSURE_LIMIT, core_free
from celeryops.core.config import Config
from celeryops.core.errors import EXIT_BROKER, EXIT_USAGE
from celeryops.ops.backend.console import open_backend
from celeryops.ops.backend.firstlook import read_first_look
from celeryops_harness.workers import WorkerProcess


def run_script(code: str, *args: str, timeout: float = 120) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; its last stdout line is JSON."""
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def app_for(broker: str) -> Celery:
    app = Celery("celeryops-firstlook-test", broker=broker, set_as_current=False)
    app.conf.broker_connection_retry_on_startup = False
    return app


def test_the_first_look_reads_what_the_backends_first_poll_reads(redis_url: str, queue_name: str, tmp_path: Path,
                                                                  start_workers: Any) -> None:
    workers: list[WorkerProcess] = start_workers(redis_url, n=2, queues=[queue_name])
    config = Config(broker=redis_url, state_dir=str(tmp_path / "state"))
    parts: dict[str, Any] = {}
    read_first_look(app_for(redis_url), config, lambda part, value, error: parts.setdefault(part, (value, error)))
    assert list(parts) == ["fleet", "slots", "unfinished", "seen"]
    assert all(error is None for _, error in parts.values())

    backend = open_backend(app_for(redis_url), config, read_only=False, fleet_display="test", state_dir=None)

    async def first_poll() -> tuple[Any, Any, Any]:
        return await backend.fleet_snapshot(), await backend.slots_snapshot(), await backend.unfinished_run()

    try:
        fleet, slots, unfinished = asyncio.run(first_poll())
    finally:
        backend.close_sync()
    looked = parts["fleet"][0]
    # all but the doctor's findings, which the console's own backend reads (it polls once it is open)
    assert looked.findings == ()
    assert looked == dataclasses.replace(fleet, findings=(), findings_note=""), (looked, fleet)
    assert {w.name for w in looked.workers} == {w.nodename for w in workers}
    assert all(w.state == "consuming" and queue_name in w.queues for w in looked.workers)
    assert (parts["slots"][0], parts["unfinished"][0]) == (slots, unfinished)
    assert queue_name in parts["seen"][0].queues


IMPORTS = """
import json, sys
from celery import Celery
from celeryops.core.config import Config
from celeryops.core.errors import EXIT_BROKER
from celeryops.ops.backend.firstlook import read_first_look
app = Celery("t", broker=sys.argv[1], set_as_current=False)
read_first_look(app, Config(broker=sys.argv[1], state_dir=sys.argv[2]), lambda *a: None)
heavy = ["celeryops.ops.run.session", "celeryops.ops.run.runner", "celeryops.ops.run.strategies",
         "celeryops.adapters.deploy.base", "celeryops.ops.backend.console", "celeryops.ops.doctor", "google", "grpc",
         "textual"]
print(json.dumps({"loaded": [m for m in heavy if m in sys.modules]}))
"""


def test_the_first_look_loads_no_session_deploy_google_nor_textual(redis_url: str, tmp_path: Path) -> None:
    """What keeps the child fast: it reads the fleet with the fleet's reads only (not even the doctor's)."""
    assert run_script(IMPORTS, redis_url, str(tmp_path / "state"))["loaded"] == []


LATE = """
import asyncio, json, os, sys
from celeryops.commands.common import FleetSpec
from celeryops.commands.console import LateBackend
from celeryops.commands.firstlook import FirstLook, read_for

spec = FleetSpec(broker=sys.argv[1])
cfg = spec.config({"state_dir": sys.argv[2]})
look = FirstLook.start(lambda send: read_for(spec, sys.argv[2], send))
assert look is not None
pid = look._pid

def opener():
    from celeryops.ops.backend.console import open_backend
    return open_backend(spec.celery_app(), cfg, read_only=False, fleet_display="test", state_dir=cfg.state_dir)

async def main():
    late = LateBackend(opener, imports=("celeryops.ops.backend.console",), read_only=False, fleet_display="t",
                       first_look=look, patience=60.0)  # a loaded machine: the child's part, not the race
    polled = asyncio.Event()
    late.on_opened = polled.set  # the console polls again at once: the findings the first look left out
    first = await late.fleet_snapshot()
    served_by_child = late._backend is None and late._opening is None
    await late.slots_snapshot()
    await late.unfinished_run()
    while late._backend is None:  # opened in the background once every part was served
        await asyncio.sleep(0.05)
        if late._opening is not None and late._opening.done():
            late._backend = late._opening.result()
    carried = sorted(late._backend.snapshots.queues)
    await asyncio.wait_for(polled.wait(), 60)
    second = await late.fleet_snapshot()
    await late.close()
    late.close_sync()
    try:
        os.waitpid(pid, os.WNOHANG)
        reaped = False
    except ChildProcessError:
        reaped = True
    print(json.dumps({"served_by_child": served_by_child, "first": sorted(w.name for w in first.workers),
                      "second": sorted(w.name for w in second.workers), "carried": carried, "reaped": reaped}))

asyncio.run(main())
"""


def test_the_console_serves_the_first_look_once_then_opens_and_goes_on_from_it(
        redis_url: str, queue_name: str, tmp_path: Path, start_workers: Any) -> None:
    workers: list[WorkerProcess] = start_workers(redis_url, n=2, queues=[queue_name])
    found = run_script(LATE, redis_url, str(tmp_path / "state"))
    names = sorted(w.nodename for w in workers)
    assert found["served_by_child"] and found["first"] == names, found
    assert found["second"] == names and queue_name in found["carried"] and found["reaped"], found


CHILD = """
import asyncio, json, os, sys, threading, time
from celeryops.commands.firstlook import FirstLook
from celeryops.core.errors import BrokerUnreachable

def good(send):
    print("child stdout", flush=True)
    sys.stderr.write("child stderr\\n")
    send("fleet", {"workers": 2}, None)
    send("slots", None, BrokerUnreachable("Lost the broker: nothing was changed; check it."))
    send("seen", "seen-state", None)
    raise RuntimeError("the child fails before the unfinished run")

def hangs(send):
    send("fleet", "first", None)
    time.sleep(600)

looks = FirstLook.start(good), FirstLook.start(hangs)  # while no thread runs here (none has started yet)

async def main():
    out = {}
    look, slow = looks
    out["fleet"] = (await look.take("fleet")).get()
    out["again"] = await look.take("fleet")
    try:
        (await look.take("slots")).get()
    except BrokerUnreachable as err:
        out["slots_error"] = [type(err).__name__, str(err), err.exit_code]
    out["unfinished"] = await look.take("unfinished")
    out["seen"] = look.seen
    look.close()
    out["slow_fleet"] = (await slow.take("fleet")).get()
    pid = slow._pid
    started = time.monotonic()
    slow.close()
    out["closed_in"] = time.monotonic() - started
    out["slow_slots"] = await slow.take("slots")
    try:
        os.kill(pid, 0)
        out["slow_gone"] = False
    except ProcessLookupError:
        out["slow_gone"] = True
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    out["with_a_thread"] = FirstLook.start(good)
    stop.set()
    thread.join()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_each_part_is_served_once_and_what_the_child_could_not_send_is_read_here() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "child" not in out.stdout and "child" not in out.stderr  # the terminal is the console's
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["fleet"] == {"workers": 2} and found["again"] is None
    assert found["slots_error"] == ["BrokerUnreachable", "Lost the broker: nothing was changed; check it.",
                                    EXIT_BROKER]
    assert found["unfinished"] is None and found["seen"] == "seen-state"
    assert found["slow_fleet"] == "first" and found["slow_slots"] is None and found["slow_gone"]
    assert found["closed_in"] < 10
    assert found["with_a_thread"] is None


def test_a_core_counts_as_free_by_cpu_pressure_where_linux_keeps_it() -> None:
    """The fork's gate: no child while as many tasks run as there are cores, nor on one core; then CPU pressure
    (the share of the last 10 s some task waited for a core) decides where the kernel keeps it, else the 1-minute
    load average. A burst that ended leaves the load average high for a minute but the pressure low: a child."""
    assert not core_free(1, 0, 0.0, 0.0)
    assert not core_free(2, 2, 0.0, 0.0)  # busy now, whatever the averages say
    assert core_free(2, 1, 1.6, 1.05)  # the load average of a burst that is over; nothing waited since
    assert not core_free(2, 1, CPU_PRESSURE_LIMIT, 0.2)  # tasks waited for a core a tenth of the time
    assert core_free(2, None, None, 0.5)  # not Linux: the load average alone
    assert not core_free(2, 1, None, 1.0)
    assert core_free(4, 3, None, 2.9)


SETTINGS = """
import json, os, select, sys
from celeryops.commands.common import FleetSpec
from celeryops.commands.firstlook import FirstLook, read_for
from celeryops.core.errors import UserError

spec = FleetSpec(broker=sys.argv[1])
look = FirstLook.start(lambda send: read_for(spec, None, send))
assert look is not None
select.select([look._fd], [], [], 60)  # the child's configuration is in
out = {}
try:
    out["settings"] = look.settings()
except UserError as err:
    out["error"] = [str(err), err.exit_code]
try:
    spec.config({"state_dir": None})
    out["here"] = None
except UserError as err:
    out["here"] = [str(err), err.exit_code]
look.close()
print(json.dumps(out))
"""


def test_the_console_takes_the_configuration_as_the_child_loaded_it(tmp_path: Path) -> None:
    """The console loads Textual while the child loads the configuration: it opens on the child's (the fleet's
    name, the broker), and does not open on a configuration the child could not load, with the same sentence it
    would have said itself."""
    def run(cwd: Path) -> dict[str, Any]:
        env = {**os.environ, "CELERYOPS_FLEET": "payments"}
        out = subprocess.run([sys.executable, "-c", SETTINGS, "redis://u:pw@127.0.0.1:1/0"], capture_output=True,
                             text=True, timeout=120, cwd=cwd, env=env)
        assert out.returncode == 0, out.stderr[-3000:]
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    good = run(tmp_path)
    assert good == {"settings": ["payments", "redis://u:pw@127.0.0.1:1/0"], "here": None}
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "celeryops.toml").write_text("[drain\ninterval = 5\n")
    found = run(bad)
    assert found["error"] == found["here"] and found["error"][1] == EXIT_USAGE
