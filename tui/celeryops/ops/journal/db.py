"""The journal's SQLite file: its schema, opening it (created and migrated for writers, read-only for readers) and
the one-sentence errors of a journal that cannot be used. Used by :class:`~celeryops.ops.journal.Journal` only."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

from celeryops.core.errors import UserError

SCHEMA_VERSION: Final = 1
CREATING_WAIT: Final = 10.0  # seconds a reader waits for a journal being created to get its schema

# ``mirror``: which fleet-held position each local record has (NULL: not copied yet), and its uid (the same in both).
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
CREATE TABLE IF NOT EXISTS mirror (seq INTEGER PRIMARY KEY, uid TEXT NOT NULL UNIQUE, fleet_seq INTEGER);
"""


def open_db(path: Path, read_only: bool) -> sqlite3.Connection:
    """The journal's connection: created and migrated for writers; read-only (creating nothing) for readers."""
    if read_only:
        return _open_read_only(path)
    where = path
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"Cannot create the state directory {where.parent} ({exc.strerror or exc}): nothing was done; "
            "make it writable or pass --state-dir to a writable directory.") from None
    if where.exists() and not where.is_file():
        raise UserError(f"The journal path {where} is not a file: nothing was done; move it aside "
                        "or pass --state-dir.")

    def prepare(conn: sqlite3.Connection) -> None:
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
            _migrate(conn, version)
        conn.execute("COMMIT")
        problems = [r[0] for r in conn.execute("PRAGMA quick_check").fetchall()]
        if problems != ["ok"]:
            raise sqlite3.DatabaseError("; ".join(str(p) for p in problems[:3]))

    return _opened(path, lambda: sqlite3.connect(where, timeout=30.0, isolation_level=None, check_same_thread=False),
                   prepare)


def _open_read_only(path: Path) -> sqlite3.Connection:
    """For readers (``status``, ``runs``): creates nothing, writes nothing, needs no write permission.

    A database without any table is a journal its creator is still writing: SQLite creates the file when the writer
    connects, and the schema appears only when the writer's first transaction commits. The reader waits for it
    (``CREATING_WAIT``) rather than calling it corrupt."""

    def prepare(conn: sqlite3.Connection) -> None:
        deadline = time.monotonic() + CREATING_WAIT
        while not conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]:
            if time.monotonic() > deadline:
                conn.close()
                raise UserError(
                    f"The run journal {path} is still empty after {CREATING_WAIT:g} s (the process creating it "
                    "stopped before writing it): nothing was done; run the command again, or move the file aside "
                    "if it stays empty.")
            time.sleep(0.05)
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        version = int(row[0]) if row else 0
        if version != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema version {version}, this celeryops reads {SCHEMA_VERSION}")
        conn.execute("SELECT count(*) FROM runs").fetchone()

    return _opened(path, lambda: sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30.0,
                                                 isolation_level=None, check_same_thread=False), prepare)


def _opened(path: Path, connect: Callable[[], sqlite3.Connection],
            prepare: Callable[[sqlite3.Connection], None]) -> sqlite3.Connection:
    """``connect()``, then ``prepare(conn)`` (checks, a migration); a failure of either closes the connection and is
    reported as a journal that cannot be used (a UserError passes as it is)."""
    conn: sqlite3.Connection | None = None
    try:
        conn = connect()
        prepare(conn)
    except UserError:
        raise
    except (sqlite3.Error, OSError, ValueError) as exc:
        if conn is not None:
            conn.close()
        raise unusable(path, exc) from None
    return conn


def _migrate(conn: sqlite3.Connection, version: int) -> None:
    # Version 0 -> 1: the tables above were just created. Later versions add steps here.
    conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))

def unusable(path: Path, exc: BaseException) -> UserError:
    text = str(exc) or type(exc).__name__
    if (isinstance(exc, sqlite3.DatabaseError) and not isinstance(exc, sqlite3.OperationalError)) or \
            "not a database" in text or "malformed" in text or "no such table" in text:
        return UserError(
            f"The run journal {path} is corrupt or not a journal ({text}): nothing was done; "
            f"move the file aside (e.g. to {path.name}.bad) and run the command again.")
    return UserError(
        f"The run journal {path} cannot be opened or written ({text}): nothing was done; "
        "check the file's permissions and free space, or pass --state-dir to a writable directory.")
