"""Reading the run journal: one run, the unfinished ones, the history; each from this journal and from the fleet's
copy in its Redis (which wins for open runs), with what this journal missed brought home.

:class:`JournalReader` is the reading half of :class:`~celeryops.ops.journal.journal.Journal` (its base class: the
journal sets the connection, the lock and the fleet copy up); :func:`newest` and :func:`unconfirmed_restore` judge
runs read from either copy.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar, cast

import redis

from celeryops.core.masking import mask_text
from celeryops.ops.journal.db import unusable
from celeryops.ops.journal.fleetcopy import FleetCopy
from celeryops.ops.journal.fleetstore import FleetStore, merge_open
from celeryops.ops.journal.model import TERMINAL_PHASES, Phase, Record, RecordKind, Run, RunLine, UnknownRun

__all__ = ["JournalReader", "newest", "unconfirmed_restore"]

log = logging.getLogger("celeryops.ops.journal.journal")

T = TypeVar("T")


class JournalReader:
    """The reads of the run journal (set up by :class:`~celeryops.ops.journal.journal.Journal`)."""

    path: Path
    read_only: bool
    lock: threading.RLock
    fleet_unread: str | None  # why the last unfinished_runs() could not read the fleet's Redis
    fleet_copy: FleetCopy
    _conn: sqlite3.Connection

    @property
    def fleet_store(self) -> FleetStore | None:
        return self.fleet_copy.store

    @fleet_store.setter
    def fleet_store(self, store: FleetStore | None) -> None:
        self.fleet_copy.store = store

    def read_sql(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self.lock:
            try:
                return work(self._conn)
            except sqlite3.Error as exc:
                raise unusable(self.path, exc) from None

    def get(self, run_id: str) -> Run:
        """The run from this journal, else from the fleet's Redis (a run of another machine)."""
        def work(conn: sqlite3.Connection) -> Run | None:
            row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                return None
            recs = conn.execute("SELECT seq, at, kind, payload, intent, settles FROM records WHERE run_id = ? "
                                "ORDER BY seq", (run_id,)).fetchall()
            return _run_from_row(row, recs)

        run = self.read_sql(work)
        if run is None and self.fleet_store is not None:
            try:
                held = self.fleet_store.read(run_id)
            except redis.RedisError:
                held = None
            run = held.run if held is not None else None
        if run is None:
            raise UnknownRun(f"No run {run_id!r} in the journal {self.path}: nothing was changed; "
                             "check the id with `celeryops runs`.")
        return run

    def stopped_consumers(self, run_id: str) -> dict[str, set[str]]:
        return self.get(run_id).stopped_consumers()

    def unfinished_runs(self, fleet: str | None = None) -> list[Run]:
        """Runs not in a terminal phase (of ``fleet``, or all), oldest first. With a fleet store for ``fleet``: also
        the runs the fleet's Redis holds open (its copy wins); a local run the fleet knows as ended is brought home
        (its end recorded here) and not listed. Redis down: the local journal's alone (``fleet_unread`` says why)."""
        terminal = tuple(TERMINAL_PHASES)
        marks = ",".join("?" * len(terminal))

        def work(conn: sqlite3.Connection) -> list[str]:
            sql = f"SELECT id FROM runs WHERE phase NOT IN ({marks})"
            args: list[object] = list(terminal)
            if fleet is not None:
                sql += " AND fleet = ?"
                args.append(fleet)
            return [str(r[0]) for r in conn.execute(sql + " ORDER BY created, id", args).fetchall()]

        local = [self.get(rid) for rid in self.read_sql(work)]
        store = self.fleet_copy.store_for(fleet) if fleet is not None else None
        if store is None:
            return local
        try:
            if not self.read_only:  # records Redis missed while it was down go first: the fleet's copy then wins
                for run in local:
                    self.fleet_copy.catch_up(run.id, store)
            runs, ended = merge_open(local, store)
        except redis.RedisError as exc:
            self.fleet_unread = mask_text(str(exc)).rstrip(".")
            log.info("the fleet-held journal could not be read (%s); local runs only", self.fleet_unread)
            return local
        self.fleet_unread = None
        if not self.read_only:
            for held in ended:
                self.fleet_copy.adopt(held)
            self._bring_home(store, [r for r in runs if r.id in {mine.id for mine in local}], local)
        return runs

    def _bring_home(self, store: FleetStore, shared: list[Run], local: list[Run]) -> None:
        """An open run both this journal and the fleet's hold, that another machine went on with (a resume from a
        teammate's machine, killed in turn): its records from there come into this journal too, so that whatever
        this machine reads of the run (``get``: what it stopped, how far it got) is the whole of it."""
        mine = {r.id: r for r in local}
        for run in shared:
            if len(run.records) > len(mine[run.id].records):
                self.bring_home(run.id, store)

    def bring_home(self, run_id: str, store: FleetStore | None) -> None:
        """The fleet's copy of ``run_id`` into this journal (the records other machines added, told apart by uid).
        Redis down, or a read-only journal: nothing (this journal's copy is all there is; the next read brings
        them)."""
        if store is None or self.read_only:
            return
        try:
            held = store.read(run_id)
        except redis.RedisError:
            return
        if held is not None:
            self.fleet_copy.adopt(held)

    def history(self, limit: int = 20, fleet: str | None = None) -> list[RunLine]:
        """The latest ``limit`` runs of this journal, newest first."""

        def work(conn: sqlite3.Connection) -> list[RunLine]:
            sql = "SELECT id, fleet, release, phase, outcome, created, updated FROM runs"
            args: list[object] = []
            if fleet is not None:
                sql += " WHERE fleet = ?"
                args.append(fleet)
            rows = conn.execute(sql + " ORDER BY created DESC, id DESC LIMIT ?", [*args, limit]).fetchall()
            return [RunLine(id=r[0], fleet=r[1], release=r[2], phase=cast(Phase, r[3]), outcome=r[4],
                               created=float(r[5]), updated=float(r[6])) for r in rows]

        return self.read_sql(work)

    def fleet_history(self, limit: int, fleet: str) -> list[Run]:
        """The fleet's latest ``limit`` runs, newest first: this journal's and those the fleet's Redis keeps (runs of
        any machine: a CI runner's deploy; ended ones for the fleet store's ``ended_ttl``). Of a run both hold, the
        copy with more records. Redis down: this journal's alone (``fleet_unread`` says why)."""
        runs = {line.id: self.get(line.id) for line in self.history(limit, fleet)}
        store = self.fleet_copy.store_for(fleet)
        if store is not None:
            try:
                held = store.recent_runs(limit)
            except redis.RedisError as exc:
                self.fleet_unread = mask_text(str(exc)).rstrip(".")
                held = []
            else:
                self.fleet_unread = None
            for copy in held:
                mine = runs.get(copy.run.id)
                if mine is None or len(copy.run.records) >= len(mine.records):
                    runs[copy.run.id] = copy.run
        return sorted(runs.values(), key=lambda r: (r.created, r.id), reverse=True)[:limit]

    def latest_ended(self, fleet: str) -> Run | None:
        """The fleet's latest run if it has ended, of this journal or of the fleet's copy (a run another machine
        ran), whichever began last; None when the latest is open or there is none. Redis down: this journal's."""
        latest = self.history(1, fleet)
        run = self.get(latest[0].id) if latest else None
        store = self.fleet_copy.store_for(fleet)
        if store is not None:
            with contextlib.suppress(redis.RedisError):
                run = newest(run, store.latest_ended())
        return run if run is not None and run.finished else None

    def unconfirmed(self, fleet: str) -> Run | None:
        """The fleet's latest run (see ``latest_ended``: this machine's or another's) if it ended aborted with
        consumers it stopped never confirmed back (its restore was unverified: a busy or reconnecting worker did not
        answer), else None."""
        return unconfirmed_restore(self.latest_ended(fleet))


def newest(*runs: Run | None) -> Run | None:
    """The run that began last (None when there is none); of two copies of one run, the later argument (pass the
    fleet's copy last: it has the records every machine added)."""
    best: Run | None = None
    for run in runs:
        if run is not None and (best is None or (run.created, run.id) >= (best.created, best.id)):
            best = run
    return best


def unconfirmed_restore(run: Run | None) -> Run | None:
    """``run`` if it ended aborted with consumers it stopped that its restore never confirmed back, else None."""
    if run is None or run.phase != "aborted":
        return None
    return run if run.unconfirmed_consumers() and run.stopped_consumers() else None


_RUN_COLUMNS: Final = "id, fleet, broker, user, host, pid, release, settings, created, updated, phase, outcome"


def _run_from_row(row: tuple[Any, ...], recs: list[tuple[Any, ...]]) -> Run:
    records = tuple(
        Record(seq=int(r[0]), at=float(r[1]), kind=cast(RecordKind, r[2]), payload=json.loads(r[3]),
               intent=r[4], settles=None if r[5] is None else int(r[5]))
        for r in recs)
    return Run(id=row[0], fleet=row[1], broker=row[2], user=row[3], host=row[4], pid=int(row[5]), release=row[6],
               settings=json.loads(row[7]), created=float(row[8]), updated=float(row[9]),
               phase=cast(Phase, row[10]), outcome=row[11], records=records)

