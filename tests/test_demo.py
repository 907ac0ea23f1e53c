"""``celeryops demo``: the sandbox and the headless demo (issue 8).

The headless demo runs as a real CLI process against real parts (redis-server or the fakeredis fallback, Celery
worker processes, the Cloud Run and registry stand-ins, a git remote). Every sandbox process inherits a unique
marker variable from the CLI, so the process table tells whether anything was left behind.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from google.cloud import run_v2
from google.cloud.run_v2.services.services.transports import ServicesGrpcTransport

from celeryops.commands.demo import _progress
from celeryops.commands.output import Printer
from celeryops.core.errors import EXIT_INTERRUPTED, EXIT_USAGE, UserError
from celeryops.demo.sandbox import RELEASE, Sandbox
from celeryops.demo.timing import Timing
from celeryops.slots import read_all
from celeryops_harness.workers import wait_for
from clihelp import CliProcess, cli_env, run_cli
from termhelp import Tmux, tmux  # noqa: F401 - the tmux fixture

MARK = "DEMO_TEST_MARK"


def marked_processes(mark: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live, non-zombie process whose environment holds ``DEMO_TEST_MARK=mark``."""
    needle = f"{MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found.append((int(entry.name), cmd))
        except (FileNotFoundError, ProcessLookupError, PermissionError, IndexError):
            continue
    return found


def demo_env(tmp_path: Path, *, hide_redis_server: bool = False) -> tuple[dict[str, str], str]:
    mark = uuid.uuid4().hex
    env = cli_env(tmp_path / "unused-state", **{MARK: mark})
    env["TMPDIR"] = str(tmp_path)  # the sandbox directory is created here: the test can see it go away
    if hide_redis_server:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        git = shutil.which("git")
        assert git is not None
        (bin_dir / "git").symlink_to(git)
        env["PATH"] = str(bin_dir)
    return env, mark


def assert_nothing_left(mark: str, tmp_path: Path, timeout: float = 30) -> None:
    try:
        wait_for(lambda: not marked_processes(mark), timeout, "every sandbox process to be gone", step=0.2)
    except TimeoutError:
        raise AssertionError(f"processes left behind: {marked_processes(mark)}") from None
    assert not list(tmp_path.glob("celeryops-demo-*")), "the sandbox directory was not removed"


def sandbox_parts(events: list[dict[str, object]]) -> str:
    return " ".join(str(e.get("message", "")) for e in events if e["event"] == "notice")


# -- fast checks ---------------------------------------------------------------------------------------------------


def test_speed_scales_every_duration() -> None:
    normal, fast = Timing(1.0), Timing(10.0)
    assert fast.long_task == (normal.long_task[0] / 10, normal.long_task[1] / 10)
    assert fast.cpu_task[1] == pytest.approx(normal.cpu_task[1] / 10)
    assert fast.drain_interval < normal.drain_interval
    assert fast.rollout < normal.rollout
    assert normal.long_task[0] >= 20  # long tasks are what a drain must wait for


@pytest.mark.parametrize("speed", [0.0, -1.0, 1000.0])
def test_nonsense_speed_is_a_usage_error(speed: float) -> None:
    with pytest.raises(UserError) as err:
        Timing(speed)
    assert err.value.exit_code == EXIT_USAGE
    assert "--speed" in str(err.value)


def test_sandbox_reports_after_the_final_json_event_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's autoscaler thread reports on its own schedule; once the final event is printed, the last line of
    stdout stays that event (CI and scripts read it) and later reports go to stderr."""
    out = io.StringIO()
    printer = Printer(as_json=True, stream=out)
    report = _progress(printer)
    report("autoscaler: started a worker")
    printer.json({"event": "deployed", "exit_code": 0, "message": "done"})
    report("autoscaler: started another worker")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["notice", "deployed"]
    assert "demo: autoscaler: started another worker" in capsys.readouterr().err


def test_json_without_headless_starts_nothing(tmp_path: Path) -> None:
    env, _ = demo_env(tmp_path)
    result = run_cli(["demo", "--json"], env)
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        "celeryops: --json only applies to celeryops demo --headless: nothing was started; add --headless."]
    assert not list(tmp_path.glob("celeryops-demo-*"))


def test_console_demo_without_a_terminal_starts_nothing(tmp_path: Path) -> None:
    env, mark = demo_env(tmp_path)
    result = run_cli(["demo", "--speed", "5"], env)
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("celeryops: ") and "no terminal: nothing was started" in lines[0]
    assert not list(tmp_path.glob("celeryops-demo-*"))
    assert not marked_processes(mark)


def test_demo_without_git_starts_nothing(tmp_path: Path) -> None:
    env, mark = demo_env(tmp_path)
    env["PATH"] = str(tmp_path / "empty-bin")  # neither git nor redis-server
    result = run_cli(["demo", "--headless"], env)
    assert result.returncode == EXIT_USAGE, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines == ["celeryops: git is not on PATH, and the demo's release checks need a git repository: nothing "
                     "was started; install git and run the demo again."]
    assert not list(tmp_path.glob("celeryops-demo-*"))
    assert not marked_processes(mark)


# -- the headless demo, end to end -------------------------------------------------------------------------------


@pytest.mark.slow
def test_headless_demo_deploys_on_fakeredis_when_redis_server_is_missing(tmp_path: Path) -> None:
    env, mark = demo_env(tmp_path, hide_redis_server=True)
    proc = CliProcess(["demo", "--headless", "--json", "--speed", "10"], env, cwd=tmp_path)
    try:
        fallback = proc.wait_event("notice", 60, where=lambda e: e["level"] == "warning")
        assert "fakeredis" in fallback["message"]
        assert marked_processes(mark), "the sandbox processes carry the marker"
        drained = proc.wait_event("drained", 120)
        deployed = proc.wait_event("deployed", 120)
        assert proc.finish(60) == 0, proc.read_stderr()
    finally:
        proc.kill()
    assert deployed["exit_code"] == 0
    events = proc.events
    assert "fakeredis on redis://127.0.0.1:" in sandbox_parts(events)
    # Every preflight check really ran: the git remote, the registry, Cloud Run IAM, the traffic split, the update
    # validated by Cloud Run (validate_only), the fleet, the fence plugin.
    checks = {e["id"]: e["status"] for e in events if e["event"] == "check" and e["status"] != "running"}
    assert checks == {"branch": "ok", "image": "ok", "freshness": "ok", "permissions": "ok", "traffic": "ok",
                      "validate": "ok", "broker": "ok", "workers": "ok", "lease": "ok",
                      "fence": "warn", "node_names": "ok",
                      "broker_safety": "warn",  # fakeredis tells neither CONFIG nor INFO
                      # celeryops doctor: the stand-in's workers say Cloud Run, and SIGTERM is not remapped
                      "settings": "ok", "shutdown_grace": "warn"}
    (summary,) = deployed["targets"]  # where the result is: revision, service URL, console link
    assert summary["revision"] and summary["url"].startswith("https://") and summary["console_url"].startswith(
        "https://console.cloud.google.com/run/detail/")
    # The drain stopped the old revision's workers, one with the fence plugin and one without.
    started = next(e for e in events if e["event"] == "started")
    old = set(started["workers"])
    assert len(old) == 2 and all(of_revision(w, 1) for w in old)
    polls = [e for e in events if e["event"] == "poll" and e["_at"] <= drained["_at"]]
    plugins = {w: info["plugin"] for w, info in polls[-1]["workers"].items() if w in old}
    assert sorted(plugins.values()) == [False, True]
    # The stand-in's update replaced them with workers of the new revision, which consume again.
    fleet = next(e for e in events if e["event"] == "fleet")
    assert fleet["workers"] and not set(fleet["workers"]) & old
    assert all(of_revision(w, 2) for w in fleet["workers"])
    assert any("revision worker-00002" in e["text"] for e in events if e["event"] == "deploy")
    assert_nothing_left(mark, tmp_path)


def of_revision(nodename: str, number: int) -> bool:
    """A demo worker's node name says its revision: ``plain-N.rev0000<number>`` (named by the launcher, no plugin)
    or ``celery@worker-0000<number>-xyz.<instance>`` (the default name, made unique by the fence plugin)."""
    return f".rev0000{number}" in nodename or f"-0000{number}-" in nodename


def headless_pool_demo(tmp_path: Path, strategy: str, wait: float) -> tuple[list[dict[str, Any]], str]:
    """``celeryops demo --strategy STRATEGY --headless --json --speed 10`` until it deployed (exit 0): its events,
    and the mark of its processes."""
    env, mark = demo_env(tmp_path)
    proc = CliProcess(["demo", "--strategy", strategy, "--headless", "--json", "--speed", "10"], env, cwd=tmp_path)
    try:
        deployed = proc.wait_event("deployed", wait)
        assert proc.finish(60) == 0, proc.read_stderr()
    finally:
        proc.kill()
    assert deployed["exit_code"] == 0
    return proc.events, mark


@pytest.mark.slow
def test_headless_demo_overlap_deploys_a_worker_pool_without_a_pause(tmp_path: Path) -> None:
    """``celeryops demo --strategy overlap``: the ``worker`` target is a worker pool whose workers all run the fence
    plugin; the deploy brings the new revision up beside the old one, drains only the old one, cuts over."""
    events, mark = headless_pool_demo(tmp_path, "overlap", 180)
    checks = {e["id"]: e["status"] for e in events if e["event"] == "check" and e["status"] != "running"}
    assert checks["fence"] == "ok" and checks["mixed_versions"] == "warn" and checks["traffic"] == "ok", checks
    steps = [e["step"] for e in events if e["event"] == "overlap" and e["step"] != "progress"]
    assert steps == ["planned", "scaling_up", "scaled_up", "consuming", "stopping_old", "old_idle", "cutting_over",
                     "cut_over"], steps
    planned = next(e for e in events if e["event"] == "overlap")
    assert planned["peak"] == 4 and planned["instances"] == {planned["old_revision"]: 2}
    started = next(e for e in events if e["event"] == "started")
    # Every instance started as celery@<this host> (as on Cloud Run, all alike); the plugin named each one.
    assert all(w.startswith(f"celery@{planned['old_revision']}.") for w in started["workers"]), started["workers"]
    assert_nothing_left(mark, tmp_path)


def test_headless_demo_autoscale_sizes_the_pool_and_deploys_beside_it(tmp_path: Path) -> None:
    """``celeryops demo --autoscale``: the ``worker`` target is a worker pool sized by the real ``celeryops
    autoscale`` (its looks published in the sandbox's Redis); the demo's deploy (drain strategy) goes through with
    the autoscaler running, one change at a time; the teardown stops it with the rest, nothing left behind."""
    env, mark = demo_env(tmp_path)
    proc = CliProcess(["demo", "--autoscale", "--headless", "--json", "--speed", "10"], env, cwd=tmp_path)
    try:
        deployed = proc.wait_event("deployed", 240)
        assert proc.finish(90) == 0, proc.read_stderr()
    finally:
        proc.kill()
    assert deployed["exit_code"] == 0
    assert "celeryops autoscale sizes the worker pool" in sandbox_parts(proc.events)
    assert "(worker pool) runs 2 Celery workers" in sandbox_parts(proc.events)
    assert_nothing_left(mark, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "wait"), [("overlap", 240), ("canary", 300)])
def test_headless_demo_autoscale_deploys_with_every_strategy(tmp_path: Path, strategy: str, wait: float) -> None:
    """``celeryops demo --autoscale --strategy overlap|canary``: the autoscaled pool (one revision, or the cohorts
    the autoscaler added by then) is deployed the strategy's way with the autoscaler running: the new revision at
    the pool's count beside every cohort, then every instance on it; the teardown leaves nothing behind."""
    env, mark = demo_env(tmp_path)
    proc = CliProcess(["demo", "--autoscale", "--strategy", strategy, "--headless", "--json", "--speed", "10"], env,
                      cwd=tmp_path)
    try:
        deployed = proc.wait_event("deployed", wait)
        assert proc.finish(90) == 0, proc.read_stderr()
    finally:
        proc.kill()
    assert deployed["exit_code"] == 0
    assert "celeryops autoscale sizes the worker pool" in sandbox_parts(proc.events)
    traffic = next(e for e in proc.events if e["event"] == "check" and e["id"] == "traffic" and e["status"] == "ok")
    planned = next(e for e in proc.events if e["event"] == "overlap" and e["step"] == "planned")
    assert sum(planned["instances"].values()) * 2 == planned["peak"], (planned, traffic["detail"])
    cut = next(e for e in proc.events if e["event"] == "overlap" and e["step"] == "cut_over")
    assert cut["split"] == {planned["new_revision"]: 100}
    assert_nothing_left(mark, tmp_path)


@pytest.mark.slow
def test_headless_demo_canary_promotes_the_good_release(tmp_path: Path) -> None:
    """``celeryops demo --strategy canary``: the good release is judged and promoted by the analysis on its own (no
    pause for the operator), and the peak named in the preflight is the promotion's (4), which the run reaches."""
    events, mark = headless_pool_demo(tmp_path, "canary", 300)
    looks = [e for e in events if e["event"] == "canary_look"]
    assert looks and looks[-1]["verdict"] == "promote" and looks[-1]["rule"] == "bound", looks[-1:]
    assert all(e["verdict"] == "continue" and not e["paused"] for e in looks[:-1])
    traffic = next(e for e in events if e["event"] == "check" and e["id"] == "traffic" and e["status"] == "ok")
    assert "4 instances at the peak" in traffic["detail"], traffic["detail"]
    peaks = {e["step"]: e["peak"] for e in events if e["event"] == "overlap" and e["step"] != "progress"}
    assert peaks["planned"] == peaks["promoting"] == 4, peaks
    assert_nothing_left(mark, tmp_path)


@pytest.mark.slow
def test_ctrl_c_mid_drain_restores_consumers_and_leaves_no_process(tmp_path: Path) -> None:
    env, mark = demo_env(tmp_path)
    proc = CliProcess(["demo", "--headless", "--json", "--speed", "3"], env, cwd=tmp_path)
    try:
        proc.wait_event("cancelled", 120)
        assert len(marked_processes(mark)) >= 4  # the CLI, the reaper, redis-server, workers
        proc.signal(signal.SIGINT)
        restored = proc.wait_event("restored", 60)
        assert proc.finish(60) == EXIT_INTERRUPTED, proc.read_stderr()
    finally:
        proc.kill()
    assert restored["restored"] and restored["verified"] and not restored["missing"]
    assert proc.events[-1]["event"] == "interrupted"
    assert not any(e["event"] == "deployed" for e in proc.events)
    assert "Traceback" not in proc.read_stderr()
    assert_nothing_left(mark, tmp_path)


@pytest.mark.slow
def test_killed_demo_leaves_no_process_behind(tmp_path: Path) -> None:
    """SIGKILL gives the demo no chance to clean up: the reaper process kills every part it was told about."""
    env, mark = demo_env(tmp_path)
    proc = CliProcess(["demo", "--headless", "--json", "--speed", "3"], env, cwd=tmp_path)
    try:
        proc.wait_event("stage", 120, where=lambda e: e["stage"] == "drain")
        assert len(marked_processes(mark)) >= 4
        proc.signal(signal.SIGKILL)
        proc.proc.wait(30)
    finally:
        proc.kill()
    try:
        wait_for(lambda: not marked_processes(mark), 30, "the reaper to kill every sandbox process", step=0.2)
    except TimeoutError:
        raise AssertionError(f"processes left behind: {marked_processes(mark)}") from None
    for leftover in tmp_path.glob("celeryops-demo-*"):  # no chance to remove it: tidy up for the next run
        shutil.rmtree(leftover, ignore_errors=True)


@pytest.mark.slow
def test_demo_console_whose_terminal_closes_mid_drain_tears_the_sandbox_down(tmp_path: Path,
                                                                              tmux: Tmux) -> None:  # noqa: F811
    """The demo runs its console as every console runs: the terminal closing (SIGHUP, then the kernel's SIGCONT)
    applies the recovery rules to the drain, then the demo tears its sandbox down itself (the directory goes too,
    which the reaper alone would leave)."""
    env, mark = demo_env(tmp_path)
    tmux.start(["demo", "--speed", "3"], {**env, "TERM": "xterm-256color"})

    def draining() -> bool:
        screen = tmux.screen()
        if "phase draining" in screen:
            return True
        if "y Confirm" in screen:
            tmux.keys("y")
        elif "Press G" in screen:
            tmux.keys("G")
        elif "S Start drain" in screen:
            tmux.keys("S")
        return False

    try:
        wait_for(draining, 120, "the demo console's drain to start (S, G, y)", step=0.5)
    except TimeoutError:
        raise AssertionError("the demo's drain did not start; its screen:\n" + tmux.screen()) from None
    assert len(marked_processes(mark)) >= 4
    tmux.tmux("kill-session", "-t", tmux.session)
    assert_nothing_left(mark, tmp_path, timeout=90)


def environ_of(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)


@pytest.mark.slow
def test_sandbox_parts_scale_out_capped_new_revision_first_and_stop(tmp_path: Path) -> None:
    """The sandbox in this process: what it starts, the autoscaler's cap, an update of the stand-in's service (its
    new revision's workers start before the old ones are taken away), the teardown."""
    before = dict(os.environ)
    sandbox = Sandbox(Timing(10), workers=2, cap=3, root=tmp_path / "sandbox")
    pids: list[int] = []
    with sandbox:
        assert sandbox.notice == ""  # redis-server is on PATH here
        assert os.environ["CELERYOPS_FLEET"] == "demo"
        assert os.environ["CELERYOPS_STATE_DIR"] == str(tmp_path / "sandbox" / "state")
        config = sandbox.config
        assert config.broker == sandbox.url and config.state_dir == str(tmp_path / "sandbox" / "state")
        (target,) = config.targets
        standin = sandbox.standin
        assert target.insecure and standin is not None and target.api_endpoint == standin.address
        assert sandbox.registry is not None and sandbox.registry.has_tag("demo/worker", sandbox.sha)
        assert sandbox.handoff().release == RELEASE and sandbox.handoff().repo == sandbox.repo
        fleet = sandbox.fleet
        assert fleet is not None
        first = fleet.live()
        assert sorted(w.app.rsplit("_", 1)[-1] for w in first) == ["fenced", "plain"]
        (old_revision,) = standin.instances("worker")
        assert {environ_of(w.pid)["K_REVISION"] for w in first} == {old_revision}
        assert all("CLOUD_RUN_WORKER_POOL" not in environ_of(w.pid) for w in first)  # a service's instances
        assert sandbox.wait_busy(tasks=2, timeout=60)
        client = redis.Redis.from_url(sandbox.url, decode_responses=True)
        wait_for(lambda: any(p.usage("cpu").total == 4 and p.usage("gpu").total == 1 for p in read_all(client).pools),
                 30, "the workers to register the cpu/gpu slot totals")
        while fleet.scale_out() is not None:  # the autoscaler may have added one already: never past the cap
            pass
        assert len(fleet.live()) == 3
        with grpc.insecure_channel(standin.address) as chan:  # an update, as the deploy sends it
            services = run_v2.ServicesClient(transport=ServicesGrpcTransport(channel=chan))
            service = services.get_service(name=target.resource_path)
            service.template.containers[0].image = f"{sandbox.registry.host}/demo/worker:{sandbox.sha}"
            services.update_service(service=service).result(timeout=120)
        (new_revision,) = set(standin.instances("worker"))
        assert new_revision != old_revision
        wait_for(lambda: not any(w.alive() for w in first), 60, "the old revision's workers to shut down")
        new = fleet.live()  # the new revision's three
        assert len(new) == 3 and all(of_revision(w.nodename, 2) for w in new)
        assert {environ_of(w.pid)["K_REVISION"] for w in new} == {new_revision}
        assert {environ_of(w.pid)["CELERYOPS_VERSION"] for w in new} == {sandbox.sha}
        assert set(first) <= set(fleet.retired)
        runs = [int(v) for v in client.mget(list(client.scan_iter("demo:runs:*")))]
        assert runs and max(runs) == 1  # the replacement (SIGTERM: warm shutdown) ran no task twice
        pids = [w.pid for w in fleet.workers]
        for pid in (sandbox.redis.pid, sandbox.reaper.pid):
            assert pid is not None
            pids.append(pid)
        client.close()
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]
    assert dict(os.environ) == before
