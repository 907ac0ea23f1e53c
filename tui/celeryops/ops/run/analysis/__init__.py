"""Judging a new revision by the task outcomes credited to it, against the old revision's (the canary's analysis):
:mod:`.rules` (the judge, pure), :mod:`.stats` (its statistics, pure), :mod:`.look` (one look's event),
:mod:`.sources` (where the revisions and crashes are read: the fence registry)."""
