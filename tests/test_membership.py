"""Membership by evidence, the pure part (ops.membership): who is gone, who is only silent, what held a drain."""

from __future__ import annotations

from celeryops.core.events import DrainProgress
from celeryops.ops.drain.membership import (
    HEARTBEAT,
    NO_LISTENER,
    PIDBOX_QUEUE,
    Evidence,
    Membership,
    departures,
    held_by,
    remedy,
)
from celeryops.ops.fleetwide.decode import decode


def test_expired_heartbeat_and_closed_control_queue_are_evidence() -> None:
    ev = Evidence(heartbeats={"p": False, "live": True}, pidbox={"a": 0, "b": 1, "c": None})
    assert departures({"p", "live", "a", "b", "c"}, {"x"}, ev) == {"p": HEARTBEAT, "a": PIDBOX_QUEUE}


def test_listener_count_decides_only_when_unambiguous() -> None:
    # One worker answered and one connection listens: nobody else is there.
    assert departures({"d1", "d2"}, {"x"}, Evidence(listeners=1)) == {"d1": NO_LISTENER, "d2": NO_LISTENER}
    # A busy solo worker keeps its subscription: one listener too many for two silent workers -> both stay silent.
    assert departures({"busy", "dead"}, {"x"}, Evidence(listeners=2)) == {}
    # A silent worker alive by its heartbeat explains its own listener.
    assert departures({"busy", "dead"}, {"x"}, Evidence(listeners=2, heartbeats={"busy": True})) == {
        "dead": NO_LISTENER}
    # Fewer listeners than workers that answered: connections are shared (not one per worker): no evidence.
    assert departures({"s"}, {"x", "y", "z"}, Evidence(listeners=1)) == {}
    assert departures({"s"}, {"x"}, Evidence(listeners=None)) == {}


def test_broker_evidence_needs_two_polls_heartbeat_counts_at_once_and_answering_rejoins() -> None:
    m = Membership()
    gone, back = m.update(0.0, {"d", "p"}, {"x"}, Evidence(listeners=1, heartbeats={"p": False}))
    assert gone == {"p": HEARTBEAT} and back == set()
    assert m.suspects == {"d": 1} and m.silent_since == {"d": 0.0}
    # The evidence did not hold (a listener came back): the count starts over.
    assert m.update(1.0, {"d"}, {"x"}, Evidence(listeners=2)) == ({}, set())
    assert m.suspects == {}
    assert m.update(2.0, {"d"}, {"x"}, Evidence(listeners=1)) == ({}, set())
    assert m.update(3.0, {"d"}, {"x"}, Evidence(listeners=1)) == ({"d": NO_LISTENER}, set())
    assert set(m.gone) == {"d", "p"} and m.silent_since == {}
    assert m.update(4.0, set(), {"x", "p"}, Evidence(listeners=2)) == ({}, {"p"})
    assert set(m.gone) == {"d"}


def test_silent_seconds_run_from_the_first_silent_poll() -> None:
    m = Membership()
    m.update(10.0, {"h"}, {"x"}, Evidence(listeners=2))
    m.update(25.0, {"h"}, {"x"}, Evidence(listeners=2))
    assert m.silent_for(["h"], 25.0) == {"h": 15.0}
    m.update(30.0, set(), {"x", "h"}, Evidence(listeners=2))
    assert m.silent_for(["h"], 31.0) == {"h": 0.0}


def progress(**kw: object) -> DrainProgress:
    base: dict[str, object] = dict(elapsed=60.0, remaining=0.0, streak=0, required=2, active=0, reserved=0,
                                   scheduled=0, unknown=(), workers={}, tasks=())
    base.update(kw)
    return DrainProgress(**base)  # type: ignore[arg-type]


def test_timeout_names_what_held_the_drain() -> None:
    assert "tasks still running (2 active, 1 reserved)" in held_by(progress(active=2, reserved=1))
    text = held_by(progress(unknown=("celery@h", "celery@b"), silent={"celery@h": 75.0, "celery@b": 9.0},
                            alive=("celery@b",)))
    assert "silent workers: celery@h (silent 75s)" in text and "--forget celery@h" in text
    assert "--forget celery@b" not in text and "busy workers" in text and "celery@b" in text
    assert "consumers still on q1 (1)" in held_by(progress(consumers={"q1": 1, "q2": 0}))
    assert "--forget celery@h" in remedy("celery@h") and "press F" in remedy("celery@h")


def test_new_poll_fields_survive_the_published_status() -> None:
    event = progress(unknown=("celery@h",), silent={"celery@h": 12.5}, alive=("celery@b",), consumers={"q": 1})
    data = event.to_json()
    assert data["silent"] == {"celery@h": 12.5} and data["consumers"] == {"q": 1}
    back = decode("poll", data)
    assert isinstance(back, DrainProgress)
    assert back.silent == event.silent and back.alive == event.alive and back.consumers == event.consumers
    old = {k: v for k, v in data.items() if k not in ("silent", "alive", "consumers")}  # an older publisher
    decoded = decode("poll", old)
    assert isinstance(decoded, DrainProgress) and decoded.silent == {} and decoded.consumers == {}
