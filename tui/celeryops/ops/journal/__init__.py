"""The run journal, written ahead of every side effect of a run: import it from here (``celeryops.ops.journal``) only.

- :mod:`.model`: phases and their moves, runs and their records, what they mean for recovery (pure data);
- :mod:`.journal`: :class:`Journal`, the SQLite journal of this operator, which keeps the fleet's copy in step;
- :mod:`.reading`: its reads (one run, the unfinished ones, the history), from both copies;
- :mod:`.db`: its SQLite file (schema, opening, the errors of a journal that cannot be used);
- :mod:`.aio`: ``Journal.aio``, the same calls as coroutines;
- :mod:`.fleetcopy`: how the journal keeps the fleet-held copy in step;
- :mod:`.fleetstore`: the fleet-held copy in the fleet's Redis (:class:`FleetStore`).
"""

from celeryops.ops.journal.aio import AsyncJournal
from celeryops.ops.journal.db import SCHEMA_VERSION
from celeryops.ops.journal.fleetcopy import FleetStoreDown
from celeryops.ops.journal.fleetstore import DAY, DEFAULT_TTL, FleetStore, HeldRun, merge_open
from celeryops.ops.journal.journal import JOURNAL_FILE, Journal, journal_path
from celeryops.ops.journal.model import (
    ADD_CONSUMERS,
    ALL_WORKERS,
    ALLOWED_TRANSITIONS,
    CANCEL_CONSUMERS,
    DEFAULT_OUTCOME,
    DEPLOY_START,
    OVERLAP_CUTOVER,
    OVERLAP_REVERT,
    OVERLAP_UP,
    PHASES,
    SCALE_POOL,
    TERMINAL_PHASES,
    InvalidTransition,
    Phase,
    Record,
    RecordKind,
    Run,
    RunLine,
    UnknownRun,
    consumers_text,
    new_run_id,
    queue_json,
)
from celeryops.ops.journal.reading import newest, unconfirmed_restore

__all__ = [
    "ADD_CONSUMERS",
    "ALLOWED_TRANSITIONS",
    "ALL_WORKERS",
    "CANCEL_CONSUMERS",
    "DAY",
    "DEFAULT_OUTCOME",
    "DEFAULT_TTL",
    "DEPLOY_START",
    "JOURNAL_FILE",
    "OVERLAP_CUTOVER",
    "OVERLAP_REVERT",
    "OVERLAP_UP",
    "PHASES",
    "SCALE_POOL",
    "SCHEMA_VERSION",
    "TERMINAL_PHASES",
    "AsyncJournal",
    "FleetStore",
    "FleetStoreDown",
    "HeldRun",
    "InvalidTransition",
    "Journal",
    "Phase",
    "Record",
    "RecordKind",
    "Run",
    "RunLine",
    "UnknownRun",
    "consumers_text",
    "journal_path",
    "merge_open",
    "new_run_id",
    "newest",
    "queue_json",
    "unconfirmed_restore",
]
