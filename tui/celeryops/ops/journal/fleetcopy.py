"""How :class:`~celeryops.ops.journal.Journal` keeps its fleet-held copy (:mod:`.fleetstore`) in step:
each record goes to the fleet's Redis before SQLite, the records Redis missed while it was down are copied at the
next write that reaches it, a run the fleet does not hold (expired, or from before) is copied whole, and a run only
the fleet holds (another machine's) is brought into the local journal, told apart record by record by uid."""

from __future__ import annotations

import logging
import secrets
import sqlite3
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Protocol, TypeVar

import redis

from celeryops.core.errors import UserError
from celeryops.core.masking import mask_text
from celeryops.ops.journal.fleetstore import FleetStore, HeldRun, head_fields, record_json
from celeryops.ops.journal.model import (
    CANCEL_CONSUMERS,
    DEPLOY_START,
    OVERLAP_CUTOVER,
    OVERLAP_REVERT,
    OVERLAP_UP,
    Run,
    UnknownRun,
    dumps_masked,
)

log = logging.getLogger("celeryops.ops.journal")

T = TypeVar("T")

# Records whose side effect stops or changes work: never done unless the fleet holds the record (a teammate can
# undo or finish it).
_STOPS: Final = {"created": "the new run", CANCEL_CONSUMERS: "the consumers about to be stopped",
                 DEPLOY_START: "the deploy about to start", OVERLAP_UP: "the worker pool update about to start",
                 OVERLAP_CUTOVER: "the worker pool update about to start",
                 OVERLAP_REVERT: "the worker pool update about to start"}
_NOT_DONE: Final = {"created": "nothing was changed", CANCEL_CONSUMERS: "they were not stopped",
                    DEPLOY_START: "it was not started", OVERLAP_UP: "it was not sent",
                    OVERLAP_CUTOVER: "it was not sent", OVERLAP_REVERT: "it was not sent"}


class FleetStoreDown(UserError):
    """The fleet's Redis did not take a record whose side effect stops work: the side effect was not done."""


def new_uid() -> str:
    return secrets.token_hex(8)


class LocalSide(Protocol):
    """What the fleet copy needs of the journal's own SQLite side (:class:`~celeryops.ops.journal.Journal` is it)."""

    path: Path
    read_only: bool
    lock: threading.RLock

    def read_sql(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

    def write_sql(self, work: Callable[[sqlite3.Connection], T]) -> T: ...

    def insert_record(self, conn: sqlite3.Connection, run_id: str, at: float, kind: str, payload_json: str,
                      intent: str | None, settles: int | None, uid: str, fleet_seq: int | None) -> int: ...

    def get(self, run_id: str) -> Run: ...


class FleetCopy:
    """The fleet-held copy of a journal (``store``; None: the journal is local only), kept in step with its SQLite
    side (``local``). ``on_warning(sentence)``: told once when a record could not reach the store, until it works
    again."""

    def __init__(self, local: LocalSide, store: FleetStore | None = None,
                 on_warning: Callable[[str], None] | None = None) -> None:
        self.local = local
        self.store = store
        self.on_warning = on_warning
        self._degraded = False

    def store_for(self, fleet: str) -> FleetStore | None:
        """The store when it holds ``fleet``'s runs, else None."""
        store = self.store
        return store if store is not None and store.fleet == fleet else None

    def fleet_of(self, run_id: str) -> str:
        """The run's fleet; a run only the fleet's Redis holds (its operator's machine is gone) is copied here."""
        row = self.local.read_sql(
            lambda conn: conn.execute("SELECT fleet FROM runs WHERE id = ?", (run_id,)).fetchone())
        if row is not None:
            return str(row[0])
        held: HeldRun | None = None
        if self.store is not None and not self.local.read_only:
            try:
                held = self.store.read(run_id)
            except redis.RedisError as exc:
                raise UnknownRun(f"Run {run_id} is not in the journal {self.local.path} and the fleet's Redis did "
                                 f"not answer ({mask_text(str(exc))}): nothing was recorded; try again when Redis "
                                 "answers.") from None
        if held is None:
            raise UnknownRun(f"No run {run_id!r} in the journal {self.local.path}: nothing was recorded; "
                             "check the id with `celeryops runs`.")
        self.adopt(held)
        return held.run.fleet

    def copy(self, run_id: str, fleet: str, kind: str, intent: str | None,
              record: Callable[[Callable[[int | None], int | None]], str], head: Mapping[str, Any], *,
              terminal: bool) -> int | None:
        """Write a record to the fleet's Redis (records it missed first); its position there, or None."""
        store = self.store_for(fleet)
        if store is None:
            return None
        fields = head_fields(head)
        try:
            self.catch_up(run_id, store)
            pos = store.write(run_id, record(self.fleet_seq), fields, terminal=terminal)
            if pos is None:  # the fleet does not hold the run (expired, or never copied): copy it whole first
                self._copy_whole(run_id, store)
                pos = store.write(run_id, record(self.fleet_seq), fields, terminal=terminal)
        except redis.RedisError as exc:
            if kind == "intent" and intent in _STOPS:
                raise self.down(str(intent), exc) from None
            self._degrade(exc)
            return None
        self._degraded = False
        return pos

    def fleet_seq(self, seq: int | None) -> int | None:
        if seq is None:
            return None
        row = self.local.read_sql(
            lambda conn: conn.execute("SELECT fleet_seq FROM mirror WHERE seq = ?", (seq,)).fetchone())
        return None if row is None or row[0] is None else int(row[0])

    def _local_records(self, run_id: str, missing_only: bool) -> list[tuple[Any, ...]]:
        sql = ("SELECT r.seq, r.at, r.kind, r.intent, r.settles, r.payload, m.uid FROM records r "
               "LEFT JOIN mirror m ON m.seq = r.seq WHERE r.run_id = ?")
        if missing_only:
            sql += " AND m.fleet_seq IS NULL"
        return self.local.read_sql(lambda conn: conn.execute(sql + " ORDER BY r.seq", (run_id,)).fetchall())

    def _copied(self, seq: int, uid: str, pos: int) -> None:
        self.local.write_sql(lambda conn: conn.execute(
            "INSERT OR REPLACE INTO mirror (seq, uid, fleet_seq) VALUES (?, ?, ?)", (seq, uid, pos)))

    def _head(self, run: Run) -> dict[str, str]:
        return head_fields({"id": run.id, "fleet": run.fleet, "broker": run.broker, "user": run.user,
                            "host": run.host, "pid": run.pid, "release": run.release,
                            "settings": dumps_masked(run.settings), "created": run.created, "updated": run.updated,
                            "phase": run.phase, "outcome": run.outcome})

    def catch_up(self, run_id: str, store: FleetStore) -> None:
        """Copy the records Redis missed while it was down, in order."""
        missing = self._local_records(run_id, missing_only=True)
        if not missing:
            return
        run = self.local.get(run_id)
        for seq, at, kind, intent, settles, payload, uid in missing:
            uid = uid or new_uid()
            pos = store.write(run_id, record_json(uid, at, kind, payload, intent, self.fleet_seq(settles)),
                              self._head(run), terminal=run.finished)
            if pos is None:
                self._copy_whole(run_id, store)
                return
            self._copied(seq, uid, pos)

    def _copy_whole(self, run_id: str, store: FleetStore) -> None:
        run = self.local.get(run_id)
        head = self._head(run)
        positions: dict[int, int] = {}
        for index, (seq, at, kind, intent, settles, payload, uid) in enumerate(self._local_records(run_id, False)):
            uid = uid or new_uid()
            pos = store.write(run_id, record_json(uid, at, kind, payload, intent, positions.get(settles)),
                              head, create=index == 0, terminal=run.finished, created=run.created)
            positions[seq] = int(pos or 0)
            self._copied(seq, uid, int(pos or 0))

    def adopt(self, held: HeldRun) -> None:
        """Bring the fleet's copy of a run into this journal: the run if it is new here, and the records another
        machine added (told apart by uid); the run's phase and outcome become the fleet's."""
        run = held.run

        def work(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run.id,)).fetchone() is None:
                conn.execute(
                    "INSERT INTO runs (id, fleet, broker, user, host, pid, release, settings, created, updated, "
                    "phase, outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (run.id, run.fleet, run.broker, run.user, run.host, run.pid, run.release,
                     dumps_masked(run.settings), run.created, run.created, run.phase, run.outcome))
            known = dict(conn.execute("SELECT m.uid, m.seq FROM mirror m JOIN records r ON r.seq = m.seq "
                                      "WHERE r.run_id = ?", (run.id,)).fetchall())
            local_of: dict[int, int] = {}
            for rec, uid in zip(run.records, held.uids, strict=True):
                if uid and uid in known:
                    local_of[rec.seq] = int(known[uid])
                    conn.execute("UPDATE mirror SET fleet_seq = ? WHERE uid = ?", (rec.seq, uid))
                    continue
                settles = None if rec.settles is None else local_of.get(rec.settles)
                local_of[rec.seq] = self.local.insert_record(conn, run.id, rec.at, rec.kind,
                                                             dumps_masked(rec.payload), rec.intent, settles,
                                                             uid or new_uid(), rec.seq)
            conn.execute("UPDATE runs SET phase = ?, outcome = ?, updated = MAX(updated, ?) WHERE id = ?",
                         (run.phase, run.outcome, run.updated, run.id))

        with self.local.lock:
            self.local.write_sql(work)

    def down(self, what: str, exc: BaseException) -> FleetStoreDown:
        return FleetStoreDown(f"Could not record {_STOPS[what]} in the fleet's Redis ({mask_text(str(exc))}): "
                              f"{_NOT_DONE[what]}; without that record nobody could recover the run from another "
                              "machine, so check that Redis answers and try again.")

    def _degrade(self, exc: BaseException) -> None:
        if self._degraded:
            return
        self._degraded = True
        message = (f"The fleet's Redis did not take the run's latest record ({mask_text(str(exc))}): it is kept in "
                   "the local journal and copied when Redis answers again; until then `celeryops status` on "
                   "another machine shows an older state of this run.")
        log.warning("%s", message)
        if self.on_warning is not None:
            self.on_warning(message)
