"""The durable, write-ahead run journal: what a drain/deploy run did, recorded *before* it did it.

One SQLite file (``<state_dir>/journal.sqlite3``, WAL mode, ``synchronous=FULL``) holds every run of this operator:
who started it, where, with which settings, its phase, its outcome and an ordered list of records. Every write is
committed before the method returns, so a SIGKILL right after a call loses nothing.

The journal is also **held by the fleet**: with a :class:`~celeryops.ops.journal.FleetStore` (the wiring gives
it one whenever the fleet has a coordination Redis), every record of a run is written to the fleet's Redis first,
then to SQLite, both before the call returns; ``unfinished_runs`` is the union of the local and the fleet-held open
runs (the fleet's copy wins), and a run known only to the fleet (its operator's machine is gone) is copied into this
journal the first time this process writes to it (``abort``/``resume`` from another machine). When Redis does not
take a record:

- the run itself and the records that stop work (``cancel_consumers``, ``deploy_start`` intents) raise
  :class:`FleetStoreDown`: the side effect does not happen (a teammate could not undo it);
- every other record (phases, settles, restores, notes) is kept locally, ``on_warning`` is told once, and the
  records the fleet missed are copied at the next write that reaches Redis.

Side effects are written ahead: ``intend()`` records what is about to happen (stop these consumers, start this
deploy) and ``settle()`` records how it went. An intent without a settle counts as *done* for anything that stops
work (we cannot know it did not happen), and as *not done* for anything that restores work (we cannot know it did),
so recovery computed from the journal alone never leaves workers stopped. The model lives in
:mod:`celeryops.ops.journal.model`; ``Journal.aio`` offers the same calls as coroutines (SQLite and Redis in a thread).
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final, TypeVar

import redis

from celeryops.core.identity import current_user
from celeryops.core.masking import mask_url
from celeryops.core.paths import state_dir as default_state_dir
from celeryops.ops.journal.aio import AsyncJournal
from celeryops.ops.journal.db import open_db, unusable
from celeryops.ops.journal.fleetcopy import FleetCopy, new_uid
from celeryops.ops.journal.fleetstore import FleetStore, head_fields, record_json
from celeryops.ops.journal.model import (
    ADD_CONSUMERS,
    ALLOWED_TRANSITIONS,
    CANCEL_CONSUMERS,
    DEFAULT_OUTCOME,
    DEPLOY_START,
    PHASES,
    TERMINAL_PHASES,
    InvalidTransition,
    Phase,
    RecordKind,
    Run,
    UnknownRun,
    dumps_masked,
    new_run_id,
    queue_json,
)
from celeryops.ops.journal.reading import JournalReader

log = logging.getLogger(__name__)

JOURNAL_FILE: Final = "journal.sqlite3"


def journal_path(state_dir: str | os.PathLike[str] | None = None) -> Path:
    return default_state_dir(state_dir) / JOURNAL_FILE


T = TypeVar("T")


class Journal(JournalReader):
    """The run journal at ``path`` (default ``<state_dir>/journal.sqlite3``). Thread-safe; one connection.

    ``fleet_store``: the fleet-held copy (see the module docstring); ``on_warning(sentence)``: told when a record
    could not reach it (once until it works again).

    ``after_write(kind)`` is called after each durable write with the record kind (``"created"``, ``"phase"``,
    ``"intent:<kind>"``, ``"settle:<kind>"``, ``"note"``): a test hook to die right between a record and its
    side effect. A phase record is then also reported as ``"phase:<new phase>"`` (to die in one precise phase)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        after_write: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
        read_only: bool = False,
        fleet_store: FleetStore | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        self.path = Path(path) if path is not None else journal_path(state_dir)
        self.read_only = read_only
        self._after_write = after_write
        self._clock = clock
        self.lock = threading.RLock()
        self.fleet_unread: str | None = None  # why the last unfinished_runs() could not read the fleet's Redis
        self._conn = open_db(self.path, read_only)
        self.aio = AsyncJournal(self)
        self.fleet_copy = FleetCopy(self, fleet_store, on_warning)

    @property
    def on_warning(self) -> Callable[[str], None] | None:
        return self.fleet_copy.on_warning

    @on_warning.setter
    def on_warning(self, told: Callable[[str], None] | None) -> None:
        self.fleet_copy.on_warning = told

    def close(self) -> None:
        with self.lock:
            self._conn.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------------------------------
    def write_sql(self, work: Callable[[sqlite3.Connection], T]) -> T:
        """One SQLite transaction (the caller holds the lock)."""
        if self.read_only:
            raise RuntimeError("this journal was opened read-only")
        try:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                result = work(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise unusable(self.path, exc) from None
        return result

    def _hook(self, *kinds: str) -> None:
        if self._after_write is not None:
            for kind in kinds:
                self._after_write(kind)

    def insert_record(self, conn: sqlite3.Connection, run_id: str, at: float, kind: str, payload_json: str,
                intent: str | None, settles: int | None, uid: str, fleet_seq: int | None) -> int:
        updated = conn.execute("UPDATE runs SET updated = MAX(updated, ?) WHERE id = ?", (at, run_id)).rowcount
        if not updated:
            raise UnknownRun(f"No run {run_id!r} in the journal {self.path}: nothing was recorded; "
                             "check the id with `celeryops runs`.")
        cur = conn.execute(
            "INSERT INTO records (run_id, at, kind, intent, settles, payload) VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, at, kind, intent, settles, payload_json))
        seq = int(cur.lastrowid or 0)
        conn.execute("INSERT INTO mirror (seq, uid, fleet_seq) VALUES (?, ?, ?)", (seq, uid, fleet_seq))
        return seq

    def create_run(
        self,
        *,
        fleet: str,
        broker: str,
        settings: Mapping[str, Any] | None = None,
        release: str | None = None,
        user: str | None = None,
        host: str | None = None,
        pid: int | None = None,
        run_id: str | None = None,
    ) -> Run:
        """Record a new run in phase ``preflight`` (in the fleet's Redis first, when the journal has a fleet store:
        :class:`FleetStoreDown` if Redis does not take it). The broker URL is stored with its password masked."""
        now = self._clock()
        at = self._clock()  # the `created` record's time
        rid = run_id or new_run_id(now)
        head = {"id": rid, "fleet": fleet, "broker": mask_url(broker), "user": user or current_user(),
                "host": host or socket.gethostname(), "pid": pid if pid is not None else os.getpid(),
                "release": release, "settings": dumps_masked(dict(settings or {})), "created": now, "updated": at,
                "phase": "preflight", "outcome": None}
        payload, uid = dumps_masked({"phase": "preflight"}), new_uid()
        with self.lock:
            if self.read_only:
                raise RuntimeError("this journal was opened read-only")
            fleet_seq: int | None = None
            store = self.fleet_copy.store_for(fleet)
            if store is not None:
                try:
                    fleet_seq = store.write(rid, record_json(uid, at, "created", payload, None, None),
                                            head_fields(head), create=True, created=now)
                except redis.RedisError as exc:
                    raise self.fleet_copy.down("created", exc) from None

            def work(conn: sqlite3.Connection) -> None:
                conn.execute(
                    "INSERT INTO runs (id, fleet, broker, user, host, pid, release, settings, created, updated, "
                    "phase, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'preflight', NULL)",
                    tuple(head[k] for k in ("id", "fleet", "broker", "user", "host", "pid", "release", "settings",
                                            "created", "updated")))
                self.insert_record(conn, rid, at, "created", payload, None, None, uid, fleet_seq)

            self.write_sql(work)
        self._hook("created")
        return self.get(rid)

    def _record(self, run_id: str, kind: RecordKind, payload: Mapping[str, Any], *, intent: str | None = None,
                settles: int | None = None, phase: Phase | None = None, outcome: str | None = None) -> int:
        """Write one record: to the fleet's Redis first (see the module docstring), then SQLite."""
        with self.lock:
            fleet = self.fleet_copy.fleet_of(run_id)
            now = self._clock()
            body, uid = dumps_masked(dict(payload)), new_uid()
            head: dict[str, Any] = {"updated": now}
            if phase is not None:
                head.update(phase=phase, outcome=outcome)
            fleet_seq = self.fleet_copy.copy(
                run_id, fleet, kind, intent, lambda fs: record_json(uid, now, kind, body, intent, fs(settles)), head,
                terminal=phase in TERMINAL_PHASES)

            def work(conn: sqlite3.Connection) -> int:
                if phase is not None:
                    conn.execute("UPDATE runs SET phase = ?, outcome = ? WHERE id = ?", (phase, outcome, run_id))
                return self.insert_record(conn, run_id, now, kind, body, intent, settles, uid, fleet_seq)

            return self.write_sql(work)

    def advance(self, run_id: str, phase: Phase, *, reason: str | None = None, outcome: str | None = None) -> Run:
        """Move a run to ``phase`` (validated against ``ALLOWED_TRANSITIONS``); terminal phases set the outcome."""
        if phase not in PHASES:
            raise InvalidTransition(f"Unknown phase {phase!r}: the run was left unchanged; use one of "
                                    f"{', '.join(PHASES)}.")
        with self.lock:
            self.fleet_copy.fleet_of(run_id)  # a run only the fleet holds is copied here first
            current = self.get(run_id).phase
            if phase not in ALLOWED_TRANSITIONS[current]:
                allowed = ", ".join(sorted(ALLOWED_TRANSITIONS[current])) or "none (the run has ended)"
                raise InvalidTransition(
                    f"Run {run_id} cannot go from {current} to {phase}: the run was left unchanged in {current}; "
                    f"allowed next phases: {allowed}.")
            final = outcome or DEFAULT_OUTCOME.get(phase)
            self._record(run_id, "phase", {"from": current, "to": phase, "reason": reason, "outcome": final},
                         phase=phase, outcome=final)
        self._hook("phase", f"phase:{phase}")
        return self.get(run_id)

    def intend(self, run_id: str, kind: str, payload: Mapping[str, Any]) -> int:
        """Record a side effect *before* performing it; returns the intent id to ``settle()`` afterwards."""
        seq = self._record(run_id, "intent", payload, intent=kind)
        self._hook(f"intent:{kind}")
        return seq

    def intend_cancel_consumers(self, run_id: str, stop: Mapping[str, Iterable[str]],
                                before: Mapping[str, Iterable[str]] | None = None) -> int:
        """About to stop ``stop`` ({worker or "*": queues}); ``before`` = what each worker consumed until now."""
        return self.intend(run_id, CANCEL_CONSUMERS, {"stop": queue_json(stop), "before": queue_json(before or {})})

    def intend_add_consumers(self, run_id: str, add: Mapping[str, Iterable[str]]) -> int:
        """About to restore ``add`` ({worker or "*": queues}); counts as restored only once settled ok."""
        return self.intend(run_id, ADD_CONSUMERS, {"add": queue_json(add)})

    def intend_deploy(self, run_id: str, *, target: str, image: str, previous: Mapping[str, Any]) -> int:
        """About to start a deploy of ``image`` to ``target``; ``previous`` = the revision/state to roll back to."""
        return self.intend(run_id, DEPLOY_START, {"target": target, "image": image, "previous": dict(previous)})

    def settle(self, intent_id: int, result: Mapping[str, Any] | None = None) -> None:
        """Record how an intent went. ``result["ok"]`` (default True) says whether it took effect."""
        with self.lock:
            row = self.read_sql(lambda conn: conn.execute(
                "SELECT run_id, intent FROM records WHERE seq = ? AND kind = 'intent'", (intent_id,)).fetchone())
            if row is None:
                raise UnknownRun(f"No intent {intent_id} in the journal {self.path}: nothing was recorded.")
            self._record(str(row[0]), "settle", {"ok": True, **dict(result or {})}, intent=row[1], settles=intent_id)
        self._hook(f"settle:{row[1]}")

    def note(self, run_id: str, payload: Mapping[str, Any]) -> int:
        """A free-form record (operator decision, warning, summary); not used by recovery."""
        seq = self._record(run_id, "note", payload)
        self._hook("note")
        return seq
