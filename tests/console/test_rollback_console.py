"""The console's B (issue 20): the run history offers a rollback on a deployed run only, asks first, then runs the
rollback through the same preflight and screens as a deploy; watch mode neither offers nor performs it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_pilot import press, settle

from celeryops.console import sample
from celeryops.console.screens.confirm import ConfirmScreen
from celeryops.console.screens.deploy import DeployScreen
from celeryops.console.screens.drain import DrainScreen
from celeryops.console.screens.preflight import PreflightScreen
from celeryops.console.screens.runs import RunsScreen
from celeryops.console.static import StaticBackend
from celeryops.core.errors import UserError
from celeryops.core.events import PhaseChanged, RunFinished, TargetRolledBack
from celeryops.ops.backend.views import RunRecordView

SIZE = (120, 36)
DEPLOYED = sample.history()[1]  # release/2.13, done


def shown_keys(app: Any) -> set[str]:
    return {key for key, active in app.screen.active_bindings.items() if active.binding.show and active.enabled}


def highlighted(app: Any) -> RunRecordView:
    screen = app.screen
    assert isinstance(screen, RunsScreen) and screen.runs is not None
    return screen.runs[screen.query_one("#runs").cursor_row]


def backend(**kwargs: Any) -> StaticBackend:
    return StaticBackend(fleet=sample.fleet(with_run=False), slots=sample.slots(), history=sample.history(),
                         preflight_script=sample.preflight_script(), proceed_script=sample.drain_script(), **kwargs)


async def test_b_rolls_a_deployed_run_back_after_a_confirmation(app_factory: Any) -> None:
    static = backend()
    app = app_factory(static)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "r")
        assert isinstance(app.screen, RunsScreen)
        offered = {}
        for _row in sample.history():  # only the finished deploy can be rolled back
            offered[highlighted(app).run_id] = "B" in shown_keys(app)
            await press(pilot, "down")
        assert offered == {r.run_id: r.run_id == DEPLOYED.run_id for r in sample.history()}
        await press(pilot, *["up"] * len(sample.history()))
        assert highlighted(app).phase == "draining"
        await press(pilot, "B")  # the deploy in progress: nothing happens
        assert isinstance(app.screen, RunsScreen) and static.calls == []

        await press(pilot, "down", "B")
        assert isinstance(app.screen, ConfirmScreen)
        assert DEPLOYED.run_id in str(app.screen.what_happens) and "nothing changes until" in str(
            app.screen.what_happens)
        await press(pilot, "n")  # declined: nothing sent
        assert isinstance(app.screen, RunsScreen) and static.calls == []

        await press(pilot, "B", "y")
        assert static.calls == [("start rollback", DEPLOYED.run_id)]
        assert isinstance(app.screen, PreflightScreen) and app.model.kind == "rollback"
        title = str(app.screen.query_one("#preflight-title").render())
        assert "Before the rollback" in title, title
        await press(pilot, "G")
        assert isinstance(app.screen, ConfirmScreen) and "routed back to its earlier revision" in str(
            app.screen.what_happens)
        await press(pilot, "y")
        assert static.calls[1:] == [("accept warnings",), ("stop consumers",)]
        assert isinstance(app.screen, DrainScreen)

        # The same screens as a deploy: the route, then the end with the revision that serves now.
        static.emit(PhaseChanged("deploying"))
        static.emit(PhaseChanged("done"))
        static.emit(RunFinished("rolled_back", 0, "Rolled back (worker serves revision worker-00041-kqz): 3 "
                                "worker(s) consume again.", targets=(TargetRolledBack(
                                    "worker", "worker-00041-kqz", previous_revision="worker-00042-abc"),)))
        await settle(pilot)
        assert isinstance(app.screen, DeployScreen)
        assert "rollback" in str(app.screen.query_one("#deploy-title").render())
        assert any("worker-00041-kqz" in line.text for line in app.model.log)
        await press(pilot, "q")
    assert app.return_value == 0


async def test_watch_mode_neither_offers_nor_performs_a_rollback(app_factory: Any) -> None:
    static = backend(read_only=True)
    app = app_factory(static)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "r", "down")
        assert highlighted(app).run_id == DEPLOYED.run_id
        registered = {binding.key for _, binding in app.screen._bindings}
        assert "B" not in registered and app.screen.check_action("rollback", ()) is False
        await press(pilot, "B")
        assert isinstance(app.screen, RunsScreen) and not any(c[0] == "start rollback" for c in static.calls)


# -- a canary deploy rolled back through the console (issue 34, item 3): the real ops backend --------------------


def _pool_backend(pool: Any) -> Any:
    from test_flows import backend_for

    from celeryops.core.configload import load_config

    config = load_config(str(pool.dir / "celeryops.toml"), pool.dir, {}, {"state_dir": str(pool.dir / "state")})
    return backend_for(pool.redis_url, pool.dir / "state", config=config, repo=pool.git.work)


def _pool_backend_at(redis_url: str, state: Path, config: Any) -> Any:
    from test_flows import backend_for

    return backend_for(redis_url, state, config=config)


@pytest.mark.slow
async def test_r_b_y_g_after_a_canary_deploy_goes_back_without_a_pause(tmp_path: Path, redis_url: str,
                                                                       queue_name: str) -> None:
    """A canary promoted by the CLI, then in the console: r, B on that deploy, y: the rollback's preflight runs its
    checks (the pool's: the peak, the fence) and G starts it, the overlap's way back: the previous revision serves
    every instance again and nothing paused."""
    from test_flows import console
    from test_flows import until as app_until

    from celeryops.console.screens.overlap import OverlapScreen
    from celeryops_harness.taskapp import work
    from clihelp import CliProcess
    from overlaphelp import WAIT, Producer, running_pool

    canary = {"look_interval": 1, "min_tasks": 30, "max_duration": 90, "alpha": 0.05}
    with running_pool(tmp_path, redis_url, queue_name, strategy="canary", canary=canary) as pool:
        config = pool.dir / "celeryops.toml"
        config.write_text(config.read_text().replace("insecure = true", 'insecure = true\nstrategy = "canary"'))
        with Producer(redis_url, pool.queue, task=work, seconds=0.02, every=0.05):
            proc = CliProcess(pool.args(), pool.env, cwd=pool.dir)
            try:
                assert proc.proc.wait(240) == 0, proc.read_stderr()[-3000:]
                proc.finish()
            finally:
                proc.kill()
            deployed = pool.new_revision()
            backend = _pool_backend(pool)
            app = console(backend)
            try:
                async with app.run_test(size=SIZE) as pilot:
                    await press(pilot, "r")
                    await app_until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.runs, WAIT,
                                    "the run history")
                    assert highlighted(app).kind == "deploy" and highlighted(app).phase == "done"
                    await press(pilot, "B")
                    await app_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "B's question")
                    await press(pilot, "y")
                    await app_until(pilot, lambda: isinstance(app.screen, PreflightScreen), 10, "the preflight")
                    await app_until(pilot, lambda: app.model.preflight is not None, WAIT, "the rollback's checks")
                    assert not app.model.failed_checks, [(c.id, c.detail) for c in app.model.failed_checks]
                    assert app.model.strategy == "canary" and app.model.checks["fence"].status == "ok"
                    title = str(app.screen.query_one("#preflight-title").render())
                    assert "previous revision consumes beside the deployed one" in title, title
                    await app_until(pilot, lambda: app.model.may_proceed, WAIT, "G to be possible")
                    await press(pilot, "G")
                    await app_until(pilot, lambda: isinstance(app.screen, ConfirmScreen), 10, "G's question")
                    said = str(app.screen.query_one("#dialog-body").render())
                    assert "4 instances at the peak" in said and "processing never pauses" in said, said
                    await press(pilot, "y")
                    await app_until(pilot, lambda: app.model.result is not None, 2 * WAIT, "the rollback to finish")
                    assert app.model.phase == "done"
                    assert isinstance(app.screen, OverlapScreen | DeployScreen)
                    assert app.model.overlap is not None and app.model.overlap.new == pool.old
                    assert app.model.result is not None and app.model.result.outcome == "rolled_back"
                    await press(pilot, "q")
            finally:
                await backend.close()
                backend.close_sync()
        assert pool.instances() == {pool.old: pool.count} and deployed != pool.old


async def test_a_preflight_that_cannot_start_shows_why_as_a_failed_check(tmp_path: Path, redis_url: str) -> None:
    """B on a canary deploy whose previous revision was deleted since: the rollback cannot start, and its preflight
    says so on screen (a failed check with the one sentence), never a checklist left at "Checking…"; nothing
    changed."""
    from test_flows import console
    from test_flows import until as app_until

    from celeryops.core.configload import load_config
    from celeryops.demo.standins.cloudrun import CloudRunStandIn, standin_config
    from celeryops.ops.journal import Journal
    from test_rollback_canary_e2e import canary_record

    with CloudRunStandIn(rollout_seconds=0.05) as standin:
        standin.add_worker_pool("proj", "europe-west1", "worker", "img:2", instances=2)
        serving = standin.resource("worker").latest_ready_revision.rsplit("/", 1)[-1]
        state = tmp_path / "state"
        with Journal(state_dir=state) as journal:
            run_id = canary_record(journal, old="worker-00000-gon", new=serving, count=2)
        (tmp_path / "celeryops.toml").write_text(standin_config(
            broker=redis_url, endpoint=standin.address, image="img:{sha}", kind="cloudrun-worker-pool").replace(
            "insecure = true", 'insecure = true\nstrategy = "canary"'))
        config = load_config(str(tmp_path / "celeryops.toml"), tmp_path, {}, {"state_dir": str(state)})
        backend = _pool_backend_at(redis_url, state, config)
        before = standin.resource("worker")
        app = console(backend)
        try:
            async with app.run_test(size=SIZE) as pilot:
                await press(pilot, "r")
                await app_until(pilot, lambda: isinstance(app.screen, RunsScreen) and app.screen.runs, 30,
                                "the run history")
                assert highlighted(app).run_id == run_id
                await press(pilot, "B", "y")
                await app_until(pilot, lambda: app.model.preflight is not None, 30, "the preflight's end")
                assert isinstance(app.screen, PreflightScreen)
                (failed,) = app.model.failed_checks
                assert failed.detail.startswith("Revision worker-00000-gon of Cloud Run worker pool worker") and (
                    "does not exist (it was deleted since" in failed.detail), failed.detail
                verdict = str(app.screen.query_one("#verdict").render())
                assert verdict.startswith("1 check(s) failed: nothing was changed."), verdict
                row = app.screen.query_one(f"#check-{failed.id}")
                assert row.has_class("fail") and app.model.checks[failed.id] == failed  # its row, on screen
                assert app.screen.check_action("proceed", ()) is None  # G: nothing to go ahead with
                await press(pilot, "q")
        finally:
            await backend.close()
            backend.close_sync()
        assert standin.resource("worker") == before
        with Journal(state_dir=state) as journal:
            assert [r.id for r in journal.history(5)] == [run_id]



class _Failing(StaticBackend):
    """A backend whose rollback cannot start: ``error`` is raised by the call that starts it."""

    error: Exception = RuntimeError("the plan exploded")

    async def start_rollback(self, run_id: str | None, on_event: Any) -> None:
        raise self.error


@pytest.mark.parametrize("error", [UserError("Run r1 is a drain run that deployed nothing, so it cannot be rolled "
                                             "back: nothing was changed; pick a deployed run."),
                                   RuntimeError("the plan exploded")], ids=["bad-input", "unexpected"])
async def test_a_run_that_cannot_start_fails_its_checklist_with_the_sentence(app_factory: Any,
                                                                              error: Exception) -> None:
    """Whatever stops a run before its checks (bad input, or an error nobody expected) reaches the preflight screen
    as a failed check with its sentence: the checklist never waits for checks that will not come."""
    static = _Failing(fleet=sample.fleet(with_run=False), slots=sample.slots(), history=sample.history())
    static.error = error
    app = app_factory(static)
    async with app.run_test(size=SIZE) as pilot:
        await press(pilot, "r", "down", "B", "y")
        await settle(pilot)
        assert isinstance(app.screen, PreflightScreen)
        (failed,) = app.model.failed_checks
        assert str(error) in failed.detail, failed.detail
        verdict = str(app.screen.query_one("#verdict").render())
        assert verdict.startswith("1 check(s) failed: nothing was changed."), verdict
        assert app.screen.check_action("proceed", ()) is None
        await press(pilot, "q")
