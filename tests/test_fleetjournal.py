"""The journal held by the fleet (issue 13): every record of an open run is in the fleet's Redis before it is in the
local journal; a second machine (another state dir) sees the run, acts on it, and the first learns how it ended.
A real redis-server; no mocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import redis

from celeryops.demo.standins.redis_server import RedisServer
from celeryops.ops.journal import FleetStore, FleetStoreDown, Journal, merge_open
from e2ehelp import dump_redis

BROKER = "redis://:pw-secret@broker:6379/0"


@pytest.fixture
def store(redis_client: redis.Redis) -> FleetStore:
    return FleetStore(redis_client, "f", ttl=3600, ended_ttl=600)


def journal(path: Path, store: FleetStore | None, **kw: object) -> Journal:
    return Journal(state_dir=path, fleet_store=store, **kw)  # type: ignore[arg-type]


def started_drain(j: Journal) -> tuple[str, int]:
    run = j.create_run(fleet="f", broker=BROKER, settings={"queues": ["a"]}, release=None)
    j.advance(run.id, "stopping")
    intent = j.intend_cancel_consumers(run.id, {"w1": ["a"], "*": ["a"]}, {"w1": ["a", "b"]})
    j.settle(intent, {"replies": 1})
    j.advance(run.id, "draining")
    return run.id, intent


def test_every_record_is_held_by_the_fleet_in_order(tmp_path: Path, store: FleetStore,
                                                    redis_client: redis.Redis) -> None:
    j = journal(tmp_path / "a", store)
    run_id, _ = started_drain(j)
    held = store.read(run_id)
    assert held is not None
    local = j.get(run_id)
    assert held.run.phase == "draining" and held.run.stopped_consumers() == local.stopped_consumers()
    assert [(r.kind, r.intent, r.payload) for r in held.run.records] == \
        [(r.kind, r.intent, r.payload) for r in local.records]
    settle = held.run.records[3]
    assert settle.kind == "settle" and settle.settles == held.run.records[2].seq  # positions, not local seqs
    assert [h.run.id for h in store.open_runs()] == [run_id]
    assert 0 < redis_client.pttl(f"celeryops:{{f}}:run:{run_id}") <= 3600_000
    assert "pw-secret" not in dump_redis(redis_client)  # masked, as in the journal
    assert json.loads(redis_client.hget(f"celeryops:{{f}}:run:{run_id}", "settings") or "") == {"queues": ["a"]}


def test_another_machine_adopts_the_run_and_the_first_learns_its_end(tmp_path: Path, store: FleetStore,
                                                                     redis_client: redis.Redis) -> None:
    owner = journal(tmp_path / "owner", store)
    run_id, _ = started_drain(owner)
    other = journal(tmp_path / "other", store)  # a fresh state dir: its local journal has never seen the run
    (seen,) = other.unfinished_runs("f")
    assert seen.id == run_id and seen.stopped_consumers() == {"w1": {"a"}, "*": {"a"}}
    assert other.history() == []  # reading copies nothing
    # The teammate's abort: restore what was stopped, end the run.
    intent = other.intend_add_consumers(run_id, seen.stopped_consumers())
    other.settle(intent, {"ok": True})
    other.advance(run_id, "aborted", reason="abort")
    assert [r.id for r in other.history()] == [run_id]  # now in the teammate's history, whole
    adopted = other.get(run_id)
    assert [r.kind for r in adopted.records] == ["created", "phase", "intent", "settle", "phase", "intent",
                                                 "settle", "phase"]
    assert adopted.stopped_consumers() == {} and adopted.phase == "aborted"
    assert store.open_runs() == [] and redis_client.pttl(f"celeryops:{{f}}:run:{run_id}") <= 600_000
    # The owner's machine comes back: its journal still says draining; the fleet's end wins and comes home.
    assert owner.unfinished_runs("f") == []
    back = owner.get(run_id)
    assert back.phase == "aborted" and back.stopped_consumers() == {}
    assert len(back.records) == 8  # its own 5 records, and the teammate's 3 (told apart by uid)


def test_a_run_a_teammate_went_on_with_comes_home_whole_while_still_open(tmp_path: Path,
                                                                        store: FleetStore) -> None:
    """The owner's deploy is killed; a teammate resumes it and stops more consumers, and is killed in turn; the
    owner resumes. What the owner's journal says the run stopped must include the teammate's stops (an overlap
    resume found the old revision 'consuming no queue' and failed, CI on 2026-12-04)."""
    owner = journal(tmp_path / "owner", store)
    run_id, _ = started_drain(owner)
    other = journal(tmp_path / "other", store)
    assert [r.id for r in other.unfinished_runs("f")] == [run_id]
    intent = other.intend_cancel_consumers(run_id, {"w2": ["c"]}, {"w2": ["c"]})
    other.settle(intent, {"replies": 1})
    assert owner.get(run_id).stopped_consumers() == {"w1": {"a"}, "*": {"a"}}  # not read yet: the local copy
    (again,) = owner.unfinished_runs("f")
    assert again.stopped_consumers() == {"w1": {"a"}, "*": {"a"}, "w2": {"c"}}
    home = owner.get(run_id)
    assert home.stopped_consumers() == again.stopped_consumers() and len(home.records) == len(again.records)
    # Read again: nothing is brought twice (told apart by uid), and the owner's next record reaches both copies.
    owner.unfinished_runs("f")
    assert len(owner.get(run_id).records) == len(again.records)
    owner.note(run_id, {"text": "the owner goes on"})
    held = store.read(run_id)
    assert held is not None and len(held.run.records) == len(owner.get(run_id).records) == len(again.records) + 1


def test_union_prefers_the_fleets_copy(tmp_path: Path, store: FleetStore) -> None:
    owner = journal(tmp_path / "owner", store)
    run_id, _ = started_drain(owner)
    local_only = journal(tmp_path / "owner", None).get(run_id)
    other = journal(tmp_path / "other", store)
    other.note(run_id, {"text": "seen by the teammate"})
    runs, ended = merge_open([local_only], store)
    assert ended == [] and [len(r.records) for r in runs] == [len(local_only.records) + 1]


def test_redis_down_refuses_what_stops_work_and_keeps_the_rest_locally(tmp_path: Path,
                                                                       own_redis: RedisServer) -> None:
    client = redis.Redis.from_url(own_redis.url, decode_responses=True, socket_connect_timeout=1, socket_timeout=2)
    warnings: list[str] = []
    j = journal(tmp_path / "a", FleetStore(client, "f"), on_warning=warnings.append)
    run = j.create_run(fleet="f", broker=BROKER)
    own_redis.stop()
    try:
        with pytest.raises(FleetStoreDown, match=r"^Could not record the new run in the fleet's Redis .*: nothing "
                                                 "was changed; .*try again\\.$"):
            j.create_run(fleet="f", broker=BROKER)
        assert [r.id for r in j.history()] == [run.id]  # the refused run is nowhere
        j.advance(run.id, "stopping")  # kept locally, said once
        j.note(run.id, {"text": "still local"})
        assert len(warnings) == 1 and "copied when Redis answers again" in warnings[0]
        with pytest.raises(FleetStoreDown, match="they were not stopped"):
            j.intend_cancel_consumers(run.id, {"*": ["a"]})
        with pytest.raises(FleetStoreDown, match="it was not started"):
            j.intend_deploy(run.id, target="svc", image="img", previous={})
        assert j.get(run.id).intents() == []  # neither intent was recorded anywhere
    finally:
        own_redis.start()
    # Redis is back, empty (no persistence): the next write copies the whole run first.
    j.intend_cancel_consumers(run.id, {"*": ["a"]})
    held = FleetStore(client, "f").read(run.id)
    assert held is not None and held.run.phase == "stopping"
    assert [r.kind for r in held.run.records] == [r.kind for r in j.get(run.id).records]
    assert held.run.stopped_consumers() == {"*": {"a"}}
    client.close()


def test_without_a_store_the_journal_is_local_only(tmp_path: Path, redis_client: redis.Redis) -> None:
    j = journal(tmp_path / "a", None)
    started_drain(j)
    assert list(redis_client.scan_iter("celeryops:*")) == []
