"""The release picker, the run history and a responsive console over the real ops layer: a real git remote (release
branches, a default branch, a feature branch), the registry stand-in (one image pushed, one not), the real journal
and a real redis-server, which a test stops (SIGSTOP) while the console keeps answering keys."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from pilothelp import type_filter
from redis.connection import AbstractConnection
from test_flows import backend_for, console, press, until

from celeryops.console.screens.home import HomeScreen
from celeryops.console.screens.releases import ReleasesScreen
from celeryops.console.screens.resume import ResumeScreen
from celeryops.console.screens.runs import RunsScreen
from celeryops.console.screens.slots import SlotsScreen
from celeryops.core.configload import load_config
from celeryops.demo.standins.gitrepo import GitFixture
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.demo.standins.registry import RegistryStandIn
from celeryops.ops.backend.console import OpsBackend
from celeryops.ops.journal import Journal

SIZE = (120, 40)


def releases_repo(root: Path) -> tuple[GitFixture, dict[str, str]]:
    """``main`` (the remote's default branch), ``release/1`` (3 days old), ``release/2`` (1 day old) and
    ``feature`` (an hour old, not a release)."""
    git = GitFixture(root, branch="main").create(age=timedelta(days=5))
    tips = {}
    for name, age in (("release/1", timedelta(days=3)), ("release/2", timedelta(days=1)),
                      ("feature", timedelta(hours=1))):
        git.git(git.other, "checkout", "--quiet", "-b", name)
        tips[name] = git.commit(git.other, f"work on {name}", age=age)
        git.push(git.other, name)
    return git, tips


def write_config(tmp_path: Path, redis_url: str, registry: RegistryStandIn, branches: str | None) -> Path:
    pattern = f'branches = "{branches}"\n' if branches else ""
    toml = tmp_path / "celeryops.toml"
    toml.write_text(f'broker = "{redis_url}"\n\n[release]\nremote = "origin"\n{pattern}\n[[targets]]\n'
                    f'name = "worker"\nkind = "command"\nimage = "{registry.host}/proj/worker:{{sha}}"\n'
                    'command = "true"\n')
    return toml


async def test_release_picker_lists_the_remotes_releases_and_enter_runs_their_preflight(
        tmp_path: Path, redis_url: str) -> None:
    git, tips = releases_repo(tmp_path / "git")
    registry = RegistryStandIn().start()
    backend: OpsBackend | None = None
    try:
        registry.seed("proj/worker", tips["release/1"])  # release/1's image is pushed, release/2's is not
        toml = write_config(tmp_path, redis_url, registry, "release/*")
        config = load_config(str(toml), tmp_path, {}, {"state_dir": str(tmp_path / "state")})
        backend = backend_for(redis_url, tmp_path / "state", config=config, repo=git.work)
        app = console(backend)
        async with app.run_test(size=SIZE) as pilot:
            await press(pilot, "D")
            await until(pilot, lambda: isinstance(app.screen, ReleasesScreen) and app.screen.view is not None, 60,
                        "the release list")
            screen = app.screen
            assert isinstance(screen, ReleasesScreen) and screen.view is not None
            listed = [(r.name, r.sha, r.image) for r in screen.view.releases]
            assert listed == [("release/2", tips["release/2"], "missing"), ("release/1", tips["release/1"], "exists")]
            ages = [time.time() - (r.committed_at or 0) for r in screen.view.releases]
            assert 0.9 * 86400 < ages[0] < 1.1 * 86400 and 2.9 * 86400 < ages[1] < 3.1 * 86400
            # The filter narrows the list to release/1. It also matches a sha's prefix: a needle of hex digits
            # ("1") matched release/2 too whenever its random sha began with one (1 run in 16).
            await type_filter(pilot, "e/1")
            assert [r.name for r in screen._shown()] == ["release/1"]
            await press(pilot, "enter", "enter")  # leave the filter box, then pick the release
            await until(pilot, lambda: app.model.preflight is not None, 60, "the preflight of release/1")
            assert app.model.kind == "deploy" and app.model.release == "release/1"
            checks = {c.id: c for c in app.model.checks.values()}
            assert checks["image"].status == "ok" and tips["release/1"][:12] in checks["branch"].detail
    finally:
        if backend is not None:
            await backend.close()
            backend.close_sync()
        registry.stop()


async def test_release_picker_default_pattern_and_git_trouble_in_one_sentence(tmp_path: Path, redis_url: str) -> None:
    """Without [release] branches every branch but the remote's default one is offered (newest first); a
    checkout without the remote shows the git problem as one sentence and deploys nothing."""
    git, _ = releases_repo(tmp_path / "git")
    registry = RegistryStandIn().start()
    backend: OpsBackend | None = None
    try:
        config = load_config(str(write_config(tmp_path, redis_url, registry, None)), tmp_path, {},
                             {"state_dir": str(tmp_path / "state")})
        backend = backend_for(redis_url, tmp_path / "state", config=config, repo=git.work)
        view = await backend.releases()
        assert [r.name for r in view.releases] == ["feature", "release/2", "release/1"]
        assert {r.image for r in view.releases} == {"missing"}
        git.git(git.work, "remote", "remove", "origin")
        app = console(backend)
        async with app.run_test(size=SIZE) as pilot:
            await press(pilot, "D")
            await until(pilot, lambda: isinstance(app.screen, ReleasesScreen) and bool(app.screen.error), 60,
                        "the git problem")
            assert isinstance(app.screen, ReleasesScreen) and "has no remote named 'origin'" in app.screen.error
            await press(pilot, "enter")
            assert app.model.kind is None, "nothing may start without a release"
            await press(pilot, "escape")
            assert isinstance(app.screen, HomeScreen)
    finally:
        if backend is not None:
            await backend.close()
            backend.close_sync()
        registry.stop()


def journal_runs(state: Path) -> tuple[str, str]:
    """Two runs in the real journal: a drain that ended aborted (consumers stopped, then restored) and a deploy
    that is still open in draining."""
    with Journal(state_dir=str(state), clock=lambda: time.time() - 3600) as journal:
        drain = journal.create_run(fleet="default", broker="redis://x", user="ops", host="laptop").id
        journal.advance(drain, "stopping")
        intent = journal.intend_cancel_consumers(drain, {"*": ["default"]}, {"w1": ["default"]})
        journal.settle(intent)
        journal.advance(drain, "draining")
        restore = journal.intend_add_consumers(drain, {"w1": ["default"]})
        journal.settle(restore)
        journal.advance(drain, "aborted", reason="max wait reached", outcome="timeout")
    with Journal(state_dir=str(state)) as journal:
        deploy = journal.create_run(fleet="default", broker="redis://x", release="release/2", user="ci",
                                    host="runner").id
        journal.advance(deploy, "stopping")
        journal.advance(deploy, "draining")
    return drain, deploy


async def test_run_history_lists_the_journals_runs_and_opens_a_timeline(tmp_path: Path, redis_url: str) -> None:
    drain, deploy = journal_runs(tmp_path / "state")
    backend = backend_for(redis_url, tmp_path / "state")
    try:
        app = console(backend)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, ResumeScreen), 30, "the resume panel of the open run")
            while not isinstance(app.screen, HomeScreen):  # the open deploy run offers the resume panel first
                await press(pilot, "escape")
            await press(pilot, "r")
            await until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.runs is not None, 30,
                        "the run history")
            screen = app.screen
            assert isinstance(screen, RunsScreen) and screen.runs is not None
            rows = [(r.run_id, r.kind, r.phase, r.release, r.owner, r.outcome, r.duration is None)
                    for r in screen.runs]
            assert rows == [(deploy, "deploy", "draining", "release/2", "ci@runner", None, True),
                            (drain, "drain", "aborted", None, "ops@laptop", "timeout", False)]
            await press(pilot, "down", "enter")
            await until(pilot, lambda: screen.opened == drain, 30, "the drain's timeline")
            lines = [str(line.text) for line in screen.query_one("#timeline").lines]
            text = "\n".join(lines)
            assert "run created by ops@laptop to drain" in text
            assert "about to cancel consumers: default on every worker" in text
            assert "phase draining → aborted: max wait reached" in text
    finally:
        await backend.close()
        backend.close_sync()


class LoopRedisCalls:
    """Every blocking redis-py call (a command sent, a reply read) to one server made on the event loop's thread while
    ``watching``: each would hold the console's loop as long as that server does not answer. Calls on other threads
    are counted too (the poll's), to show the server was really asked. The calls go through unchanged."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, port: int) -> None:
        self.loop_thread = threading.get_ident()
        self.watching = False
        self.on_loop: list[str] = []
        self.elsewhere: list[str] = []
        for name in ("send_packed_command", "read_response"):
            real = getattr(AbstractConnection, name)

            def spy(conn: Any, *args: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                if self.watching and getattr(conn, "port", None) == port:
                    seen = self.on_loop if threading.get_ident() == self.loop_thread else self.elsewhere
                    seen.append(f"{_name} on {threading.current_thread().name}")
                return _real(conn, *args, **kw)

            monkeypatch.setattr(AbstractConnection, name, spy)


async def test_the_console_answers_keys_while_redis_is_paused(tmp_path: Path, own_redis: RedisServer,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A Redis that does not answer (its process stopped by SIGSTOP until the test resumes it) holds every command
    of the console's Redis connections (the fleet poll, the published status, the slot pool, the lease read behind
    the resume panel, w's journal and lease read): the screen still answers keys, and none of those reads runs on
    its event loop's thread, while Redis is stopped or after (one there would hold the loop until Redis answers:
    the screen would freeze)."""
    journal_runs(tmp_path / "state")
    backend = backend_for(own_redis.url, tmp_path / "state")
    admin = redis.Redis.from_url(own_redis.url)
    server_pid = int(admin.info("server")["process_id"])
    calls = LoopRedisCalls(monkeypatch, own_redis.port)
    frozen = False
    try:
        app = console(backend)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: isinstance(app.screen, ResumeScreen), 30, "the resume panel of the open run")
            while not isinstance(app.screen, HomeScreen):
                await press(pilot, "escape")
                await pilot.pause(0.05)
            await pilot.app.workers.wait_for_complete()
            os.kill(server_pid, signal.SIGSTOP)
            frozen, calls.watching = True, True
            app.poll_now()  # a fleet poll starts against the stopped server and hangs there
            await pilot.pause(0.1)
            # w last: once its read returns (Redis answers, or its socket times out) it opens the resume panel
            for key, screen in (("s", SlotsScreen), ("h", HomeScreen), ("r", RunsScreen), ("h", HomeScreen),
                                ("w", HomeScreen)):
                await pilot.press(key)
                await until(pilot, lambda s=screen: isinstance(app.screen, s), 30, f"{key} to show {screen}")
            os.kill(server_pid, signal.SIGCONT)
            frozen = False
            await until(pilot, lambda: not app._polling and isinstance(app.screen, ResumeScreen), 60,
                        "the poll to finish and w's read to open the resume panel, once Redis answers again")
            calls.watching = False
            assert calls.elsewhere, "the console asked the stopped Redis nothing: the test proves nothing"
            assert not calls.on_loop, f"Redis calls on the console's event loop thread: {calls.on_loop}"
    finally:
        if frozen:
            os.kill(server_pid, signal.SIGCONT)
        admin.close()
        await backend.close()
        backend.close_sync()
