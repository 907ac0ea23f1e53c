"""The fleet's records in Redis (the journal's copy, the run lease, the fence registry, slot leases) are input: any
client of that Redis may have written them, and a bug or a foreign tool may have left them malformed. A record that
does not parse, or that belongs elsewhere (another run's or another fleet's), is named in one sentence and not acted
on: no restore and no stop on its word alone. Worker-side safe: the standard library only."""

from __future__ import annotations

from celeryops.core.errors import EXIT_FAILURE, UserError


class MalformedRecord(UserError):
    """A record of the fleet's Redis that cannot be trusted. ``str()`` is the operator's sentence."""

    def __init__(self, key: str, why: str, *, what: str = "run record", look: str = "HGETALL") -> None:
        super().__init__(
            f"The fleet's Redis holds a malformed or foreign {what} at {key} ({why}): it was not acted on, nothing "
            f"was stopped or restored; look at it ({look} {key}) and delete it if no celeryops run of this fleet "
            "wrote it.", EXIT_FAILURE)
        self.key = key
        self.why = why
