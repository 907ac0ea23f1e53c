"""The durable, write-ahead run journal: what a drain/deploy run did, recorded *before* it did it.

One SQLite file (``<state_dir>/journal.sqlite3``, WAL mode, ``synchronous=FULL``) holds every run: who started it,
where, with which settings, its phase, its outcome and an ordered list of records. Every write is committed before
the method returns, so a SIGKILL right after a call loses nothing.

Side effects are written ahead: ``intend()`` records what is about to happen (stop these consumers, start this
deploy) and ``settle()`` records how it went. An intent without a settle counts as *done* for anything that stops
work (we cannot know it did not happen), and as *not done* for anything that restores work (we cannot know it did),
so recovery computed from the journal alone never leaves workers stopped.

The core is synchronous (signal handlers and tests use it directly); ``Journal.aio`` offers the same calls as
coroutines that run the SQLite work in a thread.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import secrets
import socket
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, cast

from celeryops.core.errors import UserError
from celeryops.core.masking import mask_text, mask_url
from celeryops.core.paths import state_dir as default_state_dir

JOURNAL_FILE: Final = "journal.sqlite3"
SCHEMA_VERSION: Final = 1

Phase = Literal["preflight", "stopping", "draining", "drained", "deploying", "deployed", "done", "aborted", "failed"]
PHASES: Final[tuple[Phase, ...]] = (
    "preflight", "stopping", "draining", "drained", "deploying", "deployed", "done", "aborted", "failed",
)
TERMINAL_PHASES: Final[frozenset[Phase]] = frozenset({"done", "aborted", "failed"})
# Forward moves only. Every non-terminal phase may also end in "aborted" or "failed" (added below).
# drained -> done is a drain-only run that was closed without a deploy (e.g. after the operator restored
# consumers by hand); a drain-only run that exits 0 simply stays open in "drained" until abort or deploy.
_FORWARD: Final[dict[Phase, frozenset[Phase]]] = {
    "preflight": frozenset({"stopping"}),
    "stopping": frozenset({"draining"}),
    "draining": frozenset({"drained"}),
    "drained": frozenset({"deploying", "done"}),
    "deploying": frozenset({"deployed"}),
    "deployed": frozenset({"done"}),
}
ALLOWED_TRANSITIONS: Final[dict[Phase, frozenset[Phase]]] = {
    phase: (_FORWARD.get(phase, frozenset()) | frozenset({"aborted", "failed"}))
    if phase not in TERMINAL_PHASES else frozenset()
    for phase in PHASES
}
DEFAULT_OUTCOME: Final[dict[Phase, str]] = {"done": "succeeded", "aborted": "aborted", "failed": "failed"}

# Intent kinds the journal understands (others are stored and replayed as plain records).
CANCEL_CONSUMERS: Final = "cancel_consumers"
ADD_CONSUMERS: Final = "add_consumers"
DEPLOY_START: Final = "deploy_start"
ALL_WORKERS: Final = "*"

RecordKind = Literal["created", "phase", "intent", "settle", "note"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    fleet TEXT NOT NULL,
    broker TEXT NOT NULL,
    user TEXT NOT NULL,
    host TEXT NOT NULL,
    pid INTEGER NOT NULL,
    release TEXT,
    settings TEXT NOT NULL,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    phase TEXT NOT NULL,
    outcome TEXT
);
CREATE INDEX IF NOT EXISTS runs_fleet_phase ON runs (fleet, phase);
CREATE TABLE IF NOT EXISTS records (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL REFERENCES runs (id),
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    intent TEXT,
    settles INTEGER,
    payload TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS records_run ON records (run_id, seq);
"""


class InvalidTransition(UserError):
    """A run was asked to move to a phase it cannot reach from where it is."""


class UnknownRun(UserError):
    """No run (or intent) with that id in this journal."""


@dataclass(frozen=True)
class Record:
    """One journal entry of a run, in write order (``seq`` increases)."""

    seq: int
    at: float
    kind: RecordKind
    payload: dict[str, Any]
    intent: str | None = None  # the intent kind, for "intent" and "settle" records
    settles: int | None = None  # for "settle": the seq of the intent it settles


@dataclass(frozen=True)
class Run:
    """A run as the journal knows it (``records`` oldest first)."""

    id: str
    fleet: str
    broker: str
    user: str
    host: str
    pid: int
    release: str | None
    settings: dict[str, Any]
    created: float
    updated: float
    phase: Phase
    outcome: str | None
    records: tuple[Record, ...] = field(default=())

    @property
    def finished(self) -> bool:
        return self.phase in TERMINAL_PHASES

    def intents(self, kind: str | None = None) -> list[Record]:
        return [r for r in self.records if r.kind == "intent" and (kind is None or r.intent == kind)]

    def settlement(self, intent_seq: int) -> Record | None:
        """The settle record of an intent, or None while it is unsettled."""
        for r in self.records:
            if r.kind == "settle" and r.settles == intent_seq:
                return r
        return None

    def stopped_consumers(self) -> dict[str, set[str]]:
        """Queues stopped by this run and not yet restored, per worker (``"*"``: by broadcast, i.e. also on
        workers that appeared since). Cancel intents count as soon as recorded; restores only once settled ok."""
        stopped: dict[str, set[str]] = {}
        for rec in self.records:
            if rec.kind == "intent" and rec.intent == CANCEL_CONSUMERS:
                for worker, queues in _queue_map(_section(rec.payload, "stop")).items():
                    stopped.setdefault(worker, set()).update(queues)
            elif rec.kind == "settle" and rec.intent == ADD_CONSUMERS and rec.payload.get("ok", True):
                intent = self._record(rec.settles)
                if intent is None:
                    continue
                for worker, queues in _queue_map(_section(intent.payload, "add")).items():
                    targets = list(stopped) if worker == ALL_WORKERS else [worker]
                    for target in targets:
                        stopped.get(target, set()).difference_update(queues)
        return {w: qs for w, qs in stopped.items() if qs}

    def consumed_before(self) -> dict[str, set[str]]:
        """The queues each worker consumed before this run first stopped anything (as recorded)."""
        before: dict[str, set[str]] = {}
        for rec in self.intents(CANCEL_CONSUMERS):
            for worker, queues in _queue_map(rec.payload.get("before", {})).items():
                before.setdefault(worker, set(queues))
        return before

    def deploy(self) -> tuple[Record | None, Record | None]:
        """The latest ``deploy_start`` intent and its settle record (either may be None)."""
        starts = self.intents(DEPLOY_START)
        if not starts:
            return None, None
        return starts[-1], self.settlement(starts[-1].seq)

    def _record(self, seq: int | None) -> Record | None:
        return next((r for r in self.records if r.seq == seq), None)


@dataclass(frozen=True)
class RunSummary:
    """One line of ``celeryops runs``."""

    id: str
    fleet: str
    release: str | None
    phase: Phase
    outcome: str | None
    created: float
    updated: float

    @property
    def duration(self) -> float:
        return max(0.0, self.updated - self.created)


def new_run_id(now: float | None = None) -> str:
    """Short, sortable, unique enough: ``20261202-152916-3fa9c1`` (UTC second + 24 random bits)."""
    stamp = datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{secrets.token_hex(3)}"


def journal_path(state_dir: str | os.PathLike[str] | None = None) -> Path:
    return default_state_dir(state_dir) / JOURNAL_FILE


def _section(payload: dict[str, Any], name: str) -> object:
    """``payload[name]``; a payload given as a bare {worker: [queues]} map (generic ``intend``) is that map."""
    if name in payload:
        return payload[name]
    return {k: v for k, v in payload.items() if k not in ("before", "stop", "add")}


def _queue_map(value: object) -> dict[str, set[str]]:
    if not isinstance(value, Mapping):
        return {}
    return {str(w): {str(q) for q in qs} for w, qs in value.items() if isinstance(qs, (list, tuple, set))}


def _queue_json(value: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    return {str(w): sorted({str(q) for q in qs}) for w, qs in value.items()}


def _dumps(value: object) -> str:
    """JSON with every ``scheme://user:password@`` masked: the journal never holds a password."""
    return mask_text(json.dumps(value, sort_keys=True, default=str))


T = TypeVar("T")


class Journal:
    """The run journal at ``path`` (default ``<state_dir>/journal.sqlite3``). Thread-safe; one connection.

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
    ) -> None:
        self.path = Path(path) if path is not None else journal_path(state_dir)
        self.read_only = read_only
        self._after_write = after_write
        self._clock = clock
        self._lock = threading.Lock()
        self._conn = self._open()
        self.aio = AsyncJournal(self)

    # -- opening -----------------------------------------------------------------------------------------------
    def _open(self) -> sqlite3.Connection:
        if self.read_only:
            return self._open_read_only()
        where = self.path
        try:
            where.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UserError(
                f"Cannot create the state directory {where.parent} ({exc.strerror or exc}): nothing was done; "
                "make it writable or pass --state-dir to a writable directory.") from None
        if where.exists() and not where.is_file():
            raise UserError(f"The journal path {where} is not a file: nothing was done; move it aside "
                            "or pass --state-dir.")
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(where, timeout=30.0, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.execute("BEGIN IMMEDIATE")  # proves we can write, and makes the migration atomic
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    conn.execute(stmt)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > SCHEMA_VERSION:
                conn.execute("ROLLBACK")
                conn.close()
                raise UserError(
                    f"The journal {where} was written by a newer celeryops (schema {version}, this one reads "
                    f"{SCHEMA_VERSION}): nothing was done; upgrade celeryops or pass another --state-dir.")
            if version < SCHEMA_VERSION:
                self._migrate(conn, version)
            conn.execute("COMMIT")
            problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
            if problems != ["ok"]:
                raise sqlite3.DatabaseError("; ".join(str(p) for p in problems[:3]))
        except UserError:
            raise
        except (sqlite3.Error, OSError, ValueError) as exc:
            if conn is not None:
                conn.close()
            raise self._unusable(exc) from None
        return conn

    def _open_read_only(self) -> sqlite3.Connection:
        """For readers (``status``, ``runs``): creates nothing, writes nothing, needs no write permission."""
        conn: sqlite3.Connection | None = None
        try:
            conn = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0,
                                   isolation_level=None, check_same_thread=False)
            row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version != SCHEMA_VERSION:
                raise sqlite3.DatabaseError(f"schema version {version}, this celeryops reads {SCHEMA_VERSION}")
            conn.execute("SELECT count(*) FROM runs").fetchone()
        except (sqlite3.Error, OSError, ValueError) as exc:
            if conn is not None:
                conn.close()
            raise self._unusable(exc) from None
        return conn

    @staticmethod
    def _migrate(conn: sqlite3.Connection, version: int) -> None:
        # Version 0 -> 1: the tables above were just created. Later versions add steps here.
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

    def _unusable(self, exc: BaseException) -> UserError:
        text = str(exc) or type(exc).__name__
        if (isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)) or \
                "not a database" in text or "malformed" in text or "no such table" in text:
            return UserError(
                f"The run journal {self.path} is corrupt or not a journal ({text}): nothing was done; "
                f"move the file aside (e.g. to {self.path.name}.bad) and run the command again.")
        return UserError(
            f"The run journal {self.path} cannot be opened or written ({text}): nothing was done; "
            "check the file's permissions and free space, or pass --state-dir to a writable directory.")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------------------------------
    def _write(self, hook_kind: str | Callable[[T], str], work: Callable[[sqlite3.Connection], T]) -> T:
        if self.read_only:
            raise RuntimeError("this journal was opened read-only")
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    result = work(self._conn)
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._unusable(exc) from None
        if self._after_write is not None:
            self._after_write(hook_kind if isinstance(hook_kind, str) else hook_kind(result))
        return result

    def _append(self, conn: sqlite3.Connection, run_id: str, kind: RecordKind, payload: object,
                intent: str | None = None, settles: int | None = None) -> int:
        now = self._clock()
        updated = conn.execute("UPDATE runs SET updated = ? WHERE id = ?", (now, run_id)).rowcount
        if not updated:
            raise UnknownRun(f"No run {run_id!r} in the journal {self.path}: nothing was recorded; "
                             "check the id with `celeryops runs`.")
        cur = conn.execute(
            "INSERT INTO records (run_id, at, kind, intent, settles, payload) VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, now, kind, intent, settles, _dumps(payload)))
        return int(cur.lastrowid or 0)

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
        """Record a new run in phase ``preflight``. The broker URL is stored with its password masked."""
        now = self._clock()
        rid = run_id or new_run_id(now)
        who = user or _current_user()
        where = host or socket.gethostname()
        masked = mask_url(broker)
        settings_json = _dumps(dict(settings or {}))

        def work(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO runs (id, fleet, broker, user, host, pid, release, settings, created, updated, phase, "
                "outcome) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'preflight', NULL)",
                (rid, fleet, masked, who, where, pid if pid is not None else os.getpid(), release,
                 settings_json, now, now))
            self._append(conn, rid, "created", {"phase": "preflight"})

        self._write("created", work)
        return self.get(rid)

    def advance(self, run_id: str, phase: Phase, *, reason: str | None = None, outcome: str | None = None) -> Run:
        """Move a run to ``phase`` (validated against ``ALLOWED_TRANSITIONS``); terminal phases set the outcome."""
        if phase not in PHASES:
            raise InvalidTransition(f"Unknown phase {phase!r}: the run was left unchanged; use one of "
                                    f"{', '.join(PHASES)}.")

        def work(conn: sqlite3.Connection) -> None:
            row = conn.execute("SELECT phase FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise UnknownRun(f"No run {run_id!r} in the journal {self.path}: nothing was recorded; "
                                 "check the id with `celeryops runs`.")
            current = cast(Phase, row[0])
            if phase not in ALLOWED_TRANSITIONS[current]:
                allowed = ", ".join(sorted(ALLOWED_TRANSITIONS[current])) or "none (the run has ended)"
                raise InvalidTransition(
                    f"Run {run_id} cannot go from {current} to {phase}: the run was left unchanged in {current}; "
                    f"allowed next phases: {allowed}.")
            final = outcome or DEFAULT_OUTCOME.get(phase)
            conn.execute("UPDATE runs SET phase = ?, outcome = ? WHERE id = ?", (phase, final, run_id))
            self._append(conn, run_id, "phase", {"from": current, "to": phase, "reason": reason, "outcome": final})

        self._write("phase", work)
        if self._after_write is not None:
            self._after_write(f"phase:{phase}")
        return self.get(run_id)

    def intend(self, run_id: str, kind: str, payload: Mapping[str, Any]) -> int:
        """Record a side effect *before* performing it; returns the intent id to ``settle()`` afterwards."""
        return self._write(f"intent:{kind}",
                           lambda conn: self._append(conn, run_id, "intent", dict(payload), intent=kind))

    def intend_cancel_consumers(self, run_id: str, stop: Mapping[str, Iterable[str]],
                                before: Mapping[str, Iterable[str]] | None = None) -> int:
        """About to stop ``stop`` ({worker or "*": queues}); ``before`` = what each worker consumed until now."""
        return self.intend(run_id, CANCEL_CONSUMERS, {"stop": _queue_json(stop), "before": _queue_json(before or {})})

    def intend_add_consumers(self, run_id: str, add: Mapping[str, Iterable[str]]) -> int:
        """About to restore ``add`` ({worker or "*": queues}); counts as restored only once settled ok."""
        return self.intend(run_id, ADD_CONSUMERS, {"add": _queue_json(add)})

    def intend_deploy(self, run_id: str, *, target: str, image: str, previous: Mapping[str, Any]) -> int:
        """About to start a deploy of ``image`` to ``target``; ``previous`` = the revision/state to roll back to."""
        return self.intend(run_id, DEPLOY_START, {"target": target, "image": image, "previous": dict(previous)})

    def settle(self, intent_id: int, result: Mapping[str, Any] | None = None) -> None:
        """Record how an intent went. ``result["ok"]`` (default True) says whether it took effect."""

        def work(conn: sqlite3.Connection) -> str:
            row = conn.execute("SELECT run_id, intent FROM records WHERE seq = ? AND kind = 'intent'",
                               (intent_id,)).fetchone()
            if row is None:
                raise UnknownRun(f"No intent {intent_id} in the journal {self.path}: nothing was recorded.")
            body = {"ok": True, **dict(result or {})}
            self._append(conn, str(row[0]), "settle", body, intent=row[1], settles=intent_id)
            return str(row[1])

        self._write(lambda kind: f"settle:{kind}", work)

    def note(self, run_id: str, payload: Mapping[str, Any]) -> int:
        """A free-form record (operator decision, warning, summary); not used by recovery."""
        return self._write("note", lambda conn: self._append(conn, run_id, "note", dict(payload)))

    # -- reading -----------------------------------------------------------------------------------------------
    def _read(self, work: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            try:
                return work(self._conn)
            except sqlite3.Error as exc:
                raise self._unusable(exc) from None

    def get(self, run_id: str) -> Run:
        def work(conn: sqlite3.Connection) -> Run:
            row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise UnknownRun(f"No run {run_id!r} in the journal {self.path}: nothing was changed; "
                                 "check the id with `celeryops runs`.")
            recs = conn.execute("SELECT seq, at, kind, payload, intent, settles FROM records WHERE run_id = ? "
                                "ORDER BY seq", (run_id,)).fetchall()
            return _run_from_row(row, recs)

        return self._read(work)

    def stopped_consumers(self, run_id: str) -> dict[str, set[str]]:
        return self.get(run_id).stopped_consumers()

    def unfinished_runs(self, fleet: str | None = None) -> list[Run]:
        """Runs not in a terminal phase (of ``fleet``, or all), oldest first."""
        terminal = tuple(TERMINAL_PHASES)
        marks = ",".join("?" * len(terminal))

        def work(conn: sqlite3.Connection) -> list[str]:
            sql = f"SELECT id FROM runs WHERE phase NOT IN ({marks})"
            args: list[object] = list(terminal)
            if fleet is not None:
                sql += " AND fleet = ?"
                args.append(fleet)
            return [str(r[0]) for r in conn.execute(sql + " ORDER BY created, id", args).fetchall()]

        return [self.get(rid) for rid in self._read(work)]

    def history(self, limit: int = 20, fleet: str | None = None) -> list[RunSummary]:
        """The latest ``limit`` runs, newest first."""

        def work(conn: sqlite3.Connection) -> list[RunSummary]:
            sql = "SELECT id, fleet, release, phase, outcome, created, updated FROM runs"
            args: list[object] = []
            if fleet is not None:
                sql += " WHERE fleet = ?"
                args.append(fleet)
            rows = conn.execute(sql + " ORDER BY created DESC, id DESC LIMIT ?", [*args, limit]).fetchall()
            return [RunSummary(id=r[0], fleet=r[1], release=r[2], phase=cast(Phase, r[3]), outcome=r[4],
                               created=float(r[5]), updated=float(r[6])) for r in rows]

        return self._read(work)


_RUN_COLUMNS: Final = "id, fleet, broker, user, host, pid, release, settings, created, updated, phase, outcome"


def _run_from_row(row: tuple[Any, ...], recs: list[tuple[Any, ...]]) -> Run:
    records = tuple(
        Record(seq=int(r[0]), at=float(r[1]), kind=cast(RecordKind, r[2]), payload=json.loads(r[3]),
               intent=r[4], settles=None if r[5] is None else int(r[5]))
        for r in recs)
    return Run(id=row[0], fleet=row[1], broker=row[2], user=row[3], host=row[4], pid=int(row[5]), release=row[6],
               settings=json.loads(row[7]), created=float(row[8]), updated=float(row[9]),
               phase=cast(Phase, row[10]), outcome=row[11], records=records)


def _current_user() -> str:
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


class AsyncJournal:
    """The same journal calls as coroutines (SQLite runs in a worker thread, the event loop never blocks)."""

    def __init__(self, journal: Journal) -> None:
        self._j = journal

    async def create_run(self, **kwargs: Any) -> Run:
        return await asyncio.to_thread(lambda: self._j.create_run(**kwargs))

    async def advance(self, run_id: str, phase: Phase, *, reason: str | None = None,
                      outcome: str | None = None) -> Run:
        return await asyncio.to_thread(self._j.advance, run_id, phase, reason=reason, outcome=outcome)

    async def intend(self, run_id: str, kind: str, payload: Mapping[str, Any]) -> int:
        return await asyncio.to_thread(self._j.intend, run_id, kind, payload)

    async def intend_cancel_consumers(self, run_id: str, stop: Mapping[str, Iterable[str]],
                                      before: Mapping[str, Iterable[str]] | None = None) -> int:
        return await asyncio.to_thread(self._j.intend_cancel_consumers, run_id, stop, before)

    async def intend_add_consumers(self, run_id: str, add: Mapping[str, Iterable[str]]) -> int:
        return await asyncio.to_thread(self._j.intend_add_consumers, run_id, add)

    async def intend_deploy(self, run_id: str, *, target: str, image: str, previous: Mapping[str, Any]) -> int:
        return await asyncio.to_thread(lambda: self._j.intend_deploy(run_id, target=target, image=image,
                                                                     previous=previous))

    async def settle(self, intent_id: int, result: Mapping[str, Any] | None = None) -> None:
        await asyncio.to_thread(self._j.settle, intent_id, result)

    async def note(self, run_id: str, payload: Mapping[str, Any]) -> int:
        return await asyncio.to_thread(self._j.note, run_id, payload)

    async def get(self, run_id: str) -> Run:
        return await asyncio.to_thread(self._j.get, run_id)

    async def stopped_consumers(self, run_id: str) -> dict[str, set[str]]:
        return await asyncio.to_thread(self._j.stopped_consumers, run_id)

    async def unfinished_runs(self, fleet: str | None = None) -> list[Run]:
        return await asyncio.to_thread(self._j.unfinished_runs, fleet)

    async def history(self, limit: int = 20, fleet: str | None = None) -> list[RunSummary]:
        return await asyncio.to_thread(self._j.history, limit, fleet)
