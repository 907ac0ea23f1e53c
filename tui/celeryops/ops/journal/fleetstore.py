"""The run journal held by the fleet: a copy of every open run's records in the fleet's coordination Redis (the
broker's Redis, or ``$CELERYOPS_REDIS_URL``), so that ``abort``, ``resume`` and ``status`` work from any machine with
the broker when the operator's machine, terminal or CI runner (and its local journal) is gone.

Keys (one Cluster hash tag per fleet, :func:`~celeryops.core.namespace.fleet_key`):

- ``run:<id>``: a hash, the run's head (who, where, settings, phase, outcome), every value masked like the journal;
- ``run:<id>:records``: a list, the run's records in write order (a record's ``seq`` here is its 1-based position,
  a settle names the position of its intent); each record carries a random ``uid`` so that a local journal can tell
  its own records from the ones another machine added;
- ``runs``: a sorted set of the open runs' ids (score: created);
- ``ended``: a sorted set of the ended runs' ids (score: created; the latest 100, for ``ended_ttl``), so that
  ``abort`` and ``status`` on any machine find a recent run whose restore was never confirmed.

An open run's keys live ``ttl`` seconds after its last write (long enough for a drained run parked until its
deploy); a run that ends leaves the index and its keys expire after ``ended_ttl`` (so a machine whose local journal
still says "open" learns how it ended). Writes are one Lua script each: head, record and expiry change together.
:class:`~celeryops.ops.journal.Journal` writes here first, then to SQLite, before a record counts as written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, cast, get_args

import redis

from celeryops.core.namespace import fleet_key
from celeryops.core.untrusted import MalformedRecord
from celeryops.ops.journal.model import Phase, Record, RecordKind, Run

DAY: Final = 24 * 3600.0
DEFAULT_TTL: Final = 8 * DAY  # an open run: the parked fence's 7 days, and a day more
ENDED_TTL: Final = 7 * DAY
HEAD_FIELDS: Final = ("id", "fleet", "broker", "user", "host", "pid", "release", "settings", "created", "updated",
                      "phase", "outcome")

# KEYS: head, records, index, ended index. ARGV: mode ("create" | "append"), run_id, ttl_ms, ended_ttl_ms, terminal
# ("1"/"0"), created (index score), record json, then head field/value pairs. Returns the record's position, or -1
# when an append finds no head (the run is not held: never copied, or expired). A record added to a run that has
# ended (a restore sent again) keeps it ended.
_WRITE: Final = """
if ARGV[1] == 'append' and redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if ARGV[1] == 'create' then redis.call('DEL', KEYS[1], KEYS[2]) end
if #ARGV > 7 then redis.call('HSET', KEYS[1], unpack(ARGV, 8, #ARGV)) end
local pos = redis.call('RPUSH', KEYS[2], ARGV[7])
local phase = redis.call('HGET', KEYS[1], 'phase')
if ARGV[5] == '1' or phase == 'done' or phase == 'aborted' or phase == 'failed' then
  redis.call('ZREM', KEYS[3], ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  redis.call('ZADD', KEYS[4], tonumber(redis.call('HGET', KEYS[1], 'created') or ARGV[6]) or 0, ARGV[2])
  redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -101)
  redis.call('PEXPIRE', KEYS[4], ARGV[4])
else
  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[2])
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ARGV[3])
end
return pos
"""


@dataclass(frozen=True)
class HeldRun:
    """A run as the fleet holds it; ``uids[i]`` is the uid of ``run.records[i]``."""

    run: Run
    uids: tuple[str, ...]


def head_fields(run: Mapping[str, Any]) -> dict[str, str]:
    """The head hash of a run given as column -> value (None becomes "")."""
    return {k: "" if run.get(k) is None else str(run[k]) for k in HEAD_FIELDS if k in run}


def record_json(uid: str, at: float, kind: str, payload_json: str, intent: str | None, settles: int | None) -> str:
    """One list entry; ``payload_json`` is the journal's masked JSON text, embedded as is."""
    head = json.dumps({"uid": uid, "at": at, "kind": kind, "intent": intent, "settles": settles})
    return head[:-1] + ', "payload": ' + payload_json + "}"


class FleetStore:
    """The fleet-held journal of fleet ``fleet`` on ``client`` (a ``decode_responses=True`` client)."""

    def __init__(self, client: redis.Redis, fleet: str, *, ttl: float = DEFAULT_TTL,
                 ended_ttl: float = ENDED_TTL) -> None:
        self.client = client
        self.fleet = fleet
        self.ttl = ttl
        self.ended_ttl = ended_ttl
        self._write = client.register_script(_WRITE)

    def _keys(self, run_id: str) -> list[str]:
        return [fleet_key(self.fleet, "run", run_id), fleet_key(self.fleet, "run", run_id, "records"),
                fleet_key(self.fleet, "runs"), fleet_key(self.fleet, "ended")]

    def write(self, run_id: str, record: str, head: Mapping[str, str], *, create: bool = False,
              terminal: bool = False, created: float = 0.0) -> int | None:
        """Append ``record`` (and set ``head`` fields) atomically; returns its position, None when the run is not
        held here (append without ``create``). Raises ``redis.RedisError`` when Redis does not take it."""
        flat: list[str] = []
        for key, value in head.items():
            flat += [key, value]
        args: list[str | int | float] = ["create" if create else "append", run_id, int(self.ttl * 1000),
                                         int(self.ended_ttl * 1000), "1" if terminal else "0", created, record, *flat]
        pos = int(self._write(keys=self._keys(run_id), args=args))
        return None if pos < 0 else pos

    def read(self, run_id: str) -> HeldRun | None:
        head, rec, _, _ = self._keys(run_id)
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(head)
        pipe.lrange(rec, 0, -1)
        fields, items = pipe.execute()
        return _held(fields, items, key=head, run_id=run_id, fleet=self.fleet)

    def latest_ended(self) -> Run | None:
        """The fleet's most recent ended run (by creation) still kept, or None."""
        ids = [_text(i) for i in self.client.zrevrange(self._keys("")[3], 0, 0)]
        held = self.read(ids[0]) if ids else None
        return held.run if held is not None and held.run.finished else None

    def recent_runs(self, limit: int) -> list[HeldRun]:
        """The fleet's latest ``limit`` runs still kept, open and ended (an ended one for ``ended_ttl``, the latest
        100), newest first: what any machine of the fleet did, e.g. the deploy a rollback goes back from."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zrevrange(self._keys("")[2], 0, limit - 1, withscores=True)
        pipe.zrevrange(self._keys("")[3], 0, limit - 1, withscores=True)
        scored = {_text(i): float(score) for listing in pipe.execute() for i, score in listing}
        ids = sorted(scored, key=lambda i: (scored[i], i), reverse=True)[:limit]
        if not ids:
            return []
        for run_id in ids:
            head, rec, _, _ = self._keys(run_id)
            pipe.hgetall(head)
            pipe.lrange(rec, 0, -1)
        replies = pipe.execute()
        held = (_held(replies[i], replies[i + 1]) for i in range(0, len(replies), 2))
        return [h for h in held if h is not None]

    def open_runs(self) -> list[HeldRun]:
        """The fleet's open runs, oldest first (ids whose keys expired are skipped)."""
        ids = [_text(i) for i in self.client.zrange(self._keys("")[2], 0, -1)]
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        for run_id in ids:
            head, rec, _, _ = self._keys(run_id)
            pipe.hgetall(head)
            pipe.lrange(rec, 0, -1)
        replies = pipe.execute()
        held = [_held(replies[i], replies[i + 1], key=self._keys(ids[i // 2])[0], run_id=ids[i // 2], fleet=self.fleet)
                for i in range(0, len(replies), 2)]
        runs = [h for h in held if h is not None and not h.run.finished]
        return sorted(runs, key=lambda h: (h.run.created, h.run.id))


def merge_open(local: Iterable[Run], store: FleetStore | None) -> tuple[list[Run], list[HeldRun]]:
    """The open runs of the store's fleet: the local journal's and the fleet's (the fleet's copy wins for a run both
    know; a local run the fleet knows as ended is not open). Also returns the fleet's copies of local runs that ended
    elsewhere (to bring home). Raises ``redis.RedisError`` when Redis does not answer."""
    merged = {r.id: r for r in local}
    if store is None:
        return sorted(merged.values(), key=lambda r: (r.created, r.id)), []
    held = store.open_runs()
    ended: list[HeldRun] = []
    open_ids = {h.run.id for h in held}
    for run_id in [i for i in merged if i not in open_ids]:
        copy = store.read(run_id)
        if copy is not None and copy.run.finished:
            del merged[run_id]
            ended.append(copy)
    merged.update({h.run.id: h.run for h in held})
    return sorted(merged.values(), key=lambda r: (r.created, r.id)), ended


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


RECORD_KINDS: Final = frozenset(get_args(RecordKind))
PHASES: Final = frozenset(get_args(Phase))


def _held(fields: Mapping[Any, Any], items: list[Any], *, key: str = "", run_id: str = "",
          fleet: str = "") -> HeldRun | None:
    """The run held at ``key`` (the copy of run ``run_id`` of ``fleet``), or None when its keys expired. Raises
    ``MalformedRecord`` (one sentence; nothing is done on its word) when it does not parse or is foreign: another
    run's head under this id, another fleet's run."""
    head = {_text(k): _text(v) for k, v in (fields or {}).items()}
    if not head:
        return None
    if not head.get("id"):
        raise MalformedRecord(key, "its head has no run id")
    if run_id and head["id"] != run_id:
        raise MalformedRecord(key, f"its head names run {head['id']!r}, not {run_id!r}")
    if fleet and head.get("fleet") and head["fleet"] != fleet:
        raise MalformedRecord(key, f"it is a run of fleet {head['fleet']!r}, not {fleet!r}")
    if head.get("phase") and head["phase"] not in PHASES:
        raise MalformedRecord(key, f"its phase {head['phase']!r} is not a run phase")
    try:
        return _parse_held(head, items)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise MalformedRecord(key, f"{type(exc).__name__}: {exc}") from None


def _parse_held(head: dict[str, str], items: list[Any]) -> HeldRun:
    records: list[Record] = []
    uids: list[str] = []
    for pos, raw in enumerate(items, start=1):
        data = json.loads(_text(raw))
        if not isinstance(data, dict):
            raise ValueError(f"record {pos} is not a JSON object")
        if data.get("kind") not in RECORD_KINDS:
            raise ValueError(f"record {pos} has the unknown kind {data.get('kind')!r}")
        payload = data.get("payload") or {}
        if not isinstance(payload, dict):
            raise ValueError(f"record {pos}'s payload is not a JSON object")
        intent = data.get("intent")
        if intent is not None and not isinstance(intent, str):
            raise ValueError(f"record {pos}'s intent is not text")
        settles = data.get("settles")
        records.append(Record(seq=pos, at=float(data.get("at") or 0.0), kind=cast(RecordKind, data["kind"]),
                              payload=dict(payload), intent=intent,
                              settles=None if settles is None else int(settles)))
        uids.append(str(data.get("uid") or ""))
    settings = json.loads(head.get("settings") or "{}")
    if not isinstance(settings, dict):
        raise ValueError("its settings are not a JSON object")
    run = Run(id=head["id"], fleet=head.get("fleet", ""), broker=head.get("broker", ""), user=head.get("user", "?"),
              host=head.get("host", "?"), pid=int(head.get("pid") or 0), release=head.get("release") or None,
              settings=settings, created=float(head.get("created") or 0.0),
              updated=float(head.get("updated") or 0.0), phase=cast(Phase, head.get("phase") or "preflight"),
              outcome=head.get("outcome") or None, records=tuple(records))
    return HeldRun(run, tuple(uids))
