"""The canary's look event (``canary_look``) in the one event vocabulary: built from the real judge, round-tripped
through ``to_json``/``decode`` and the published status on a real redis-server, printed as one line (text) or one
JSON object (``--json``); and the operator's canary decisions, polled and awaited."""

from __future__ import annotations

import asyncio
import io
import json
import threading
from pathlib import Path

import pytest
import redis
from celery import Celery

from celeryops.commands.output import Printer
from celeryops.console.samplecanary import SETTINGS, canary_look, canary_script
from celeryops.core.canary import CanarySettings, RevisionCounts
from celeryops.core.canarylook import CanaryLook
from celeryops.core.config import Config
from celeryops.core.errors import ReadOnlyRefused, UserError
from celeryops.ops.backend.console import open_backend
from celeryops.ops.fleetwide.decode import decode
from celeryops.ops.fleetwide.publish import Publisher, read_events
from celeryops.ops.run.analysis.look import look_event
from celeryops.ops.run.analysis.rules import judge
from celeryops.ops.run.decisions import (
    Decisions,
    PauseCanary,
    PromoteNow,
    RollbackNow,
    decisions_of,
)
from celeryops.ops.run.operator import ConsoleOperator, FlagOperator


def bad_release_look() -> CanaryLook:
    """A canary failing a fifth of its tasks with an exception the baseline never raised: rolled back."""
    settings = CanarySettings(min_tasks=20, ignore_exceptions=("SoftTimeLimitExceeded",))
    old = RevisionCounts(succeeded=390, failed={"IOError": 4, "SoftTimeLimitExceeded": 6}, retried=3,
                         runtimes=(1.0, 2.0, 3.0))
    new = RevisionCounts(succeeded=40, failed={"KeyError": 10}, runtimes=(1.5, 2.5))
    judgement = judge(old, new, crashes=1, look=7, elapsed=210.0, settings=settings)
    by_task = {("old-1", "a.task"): old, ("new-2", "a.task"): new, ("old-1", "b.task"): RevisionCounts(succeeded=2),
               ("other", "b.task"): RevisionCounts(succeeded=99)}
    return look_event(judgement, target="pool", baseline="old-1", canary="new-2",
                      by_revision={"old-1": old, "new-2": new, "": RevisionCounts(succeeded=5)}, by_task=by_task)


def test_the_look_carries_counts_statistic_and_verdict() -> None:
    look = bad_release_look()
    assert (look.kind, look.verdict, look.rule, look.look, look.elapsed, look.max_duration) == (
        "canary_look", "rollback", "new-exception", 7, 210.0, 900.0)
    assert look.new_exceptions == ("KeyError",) and look.crashes == 1 and look.min_tasks == 20
    base, can = look.side("baseline"), look.side("canary")
    # the ignored type is left out everywhere, as the judge leaves it out; unattributed workers ("") too
    assert (base.completed, base.failed, base.exceptions, base.retried) == (394, 4, {"IOError": 4}, 3)
    assert (can.completed, can.failed, can.exceptions) == (50, 10, {"KeyError": 10})
    assert can.rate == 0.2 and can.low < 0.2 < can.high and (can.p50, base.p95) == (2.0, 2.9)
    assert look.tasks["b.task"]["baseline"].completed == 2 and look.tasks["b.task"]["canary"].completed == 0
    assert look.p_value < 0.001 and 0 < look.alpha_look < SETTINGS.alpha
    assert look.increase_low < look.increase < look.increase_high


def test_to_json_and_decode_round_trip() -> None:
    for look in (bad_release_look(), *[e for e in canary_script() if isinstance(e, CanaryLook)],
                 canary_look(30, (900, 9), (60, 1), paused=True)):
        data = json.loads(json.dumps(look.to_json()))
        assert data["event"] == "canary_look" and set(data["counts"]) == {"baseline", "canary"}
        assert decode("canary_look", data) == look
        assert CanaryLook.from_json(data) == look
    assert decode("canary_look", {"look": 1, "verdict": "maybe"}) is None  # not a verdict: unknown, no traceback
    assert decode("canary_look", {"verdict": "continue"}) is None


def test_printer_prints_one_line_per_look_or_the_json_object() -> None:
    look = bad_release_look()
    text = io.StringIO()
    Printer(as_json=False, stream=text)(look)
    lines = text.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("pool: canary new-2 vs old-1, look 7/30 (3 minutes and 30 seconds of 15 minutes): "
                               "Roll back: the canary raised KeyError (10 times)")
    assert "increase +" in lines[0] and "(alpha " in lines[0]
    out = io.StringIO()
    printer = Printer(as_json=True, stream=out)
    printer(look)
    assert json.loads(out.getvalue()) == json.loads(json.dumps(look.to_json())) and not printer.finished
    waiting = canary_script()[-1]
    text = io.StringIO()
    Printer(as_json=False, stream=text)(waiting)  # type: ignore[arg-type]
    assert "Decides it: promote after" in text.getvalue()


async def test_published_looks_decode_for_watchers(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    pub = Publisher(client, "canary-fleet", run_id="run-c", owner="alice", host="box", release="v2",
                    started_at=1.0)
    pub.start()
    looks = [e for e in canary_script() if isinstance(e, CanaryLook)]
    for look in looks:
        pub.event(look.kind, look.to_json())
    assert await pub.close()
    entries = read_events(client, "canary-fleet")
    assert [decode(e.kind, e.data) for e in entries if e.kind == "canary_look"] == looks


async def test_decisions_are_polled_in_order_and_awaited_across_threads() -> None:
    box = Decisions()
    assert box.poll() is None
    box.send(PauseCanary())
    box.send(PauseCanary(paused=False))
    assert [d.action for d in (box.poll(), box.poll())] == ["pause", "resume"]  # type: ignore[union-attr]
    assert await box.next(timeout=0.01) is None
    sender = threading.Thread(target=lambda: box.send(RollbackNow()))
    waiting = asyncio.ensure_future(box.next(timeout=60))
    await asyncio.sleep(0)
    sender.start()
    assert await waiting == RollbackNow()
    sender.join()
    box.send(PromoteNow())
    assert await box.next() == PromoteNow() and box.poll() is None


def test_only_the_console_operator_sends_canary_decisions() -> None:
    operator = ConsoleOperator()
    assert decisions_of(operator) is operator.decisions
    assert decisions_of(FlagOperator()) is None


async def test_the_ops_backend_refuses_decisions_without_a_canary_or_read_only(redis_url: str,
                                                                               tmp_path: Path) -> None:
    app = Celery("canary-decisions", broker=redis_url, set_as_current=False)
    for read_only, refused in ((True, ReadOnlyRefused), (False, UserError)):
        backend = open_backend(app, Config(broker=redis_url), read_only=read_only, fleet_display="fleet",
                               state_dir=str(tmp_path / str(read_only)))
        try:
            with pytest.raises(refused) as caught:
                await backend.canary_decision(PromoteNow())
            if not read_only:
                assert str(caught.value) == ("There is no canary running in this console to promote: nothing was "
                                             "changed.")
        finally:
            await backend.close()
            backend.close_sync()
