"""Exit codes (a contract: users script against them) and the one-sentence user error."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
EXIT_BROKER = 4
EXIT_PREFLIGHT = 5
EXIT_DEPLOY = 6
EXIT_CANARY_ROLLED_BACK = 7  # the canary's analysis rolled it back (the old revision serves, as before)
EXIT_CANARY_PAUSED = 8  # the canary had no verdict by max_duration: paused for the operator, both consume
EXIT_INTERRUPTED = 130


class UserError(Exception):
    """A problem the operator can fix. ``str(err)`` is one sentence: what failed, what was left unchanged,
    what to do next. The CLI prints it without a traceback and exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILURE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class PreflightError(UserError):
    """A precondition the operator can fix, found before anything changed (exit ``EXIT_PREFLIGHT``): ``detail``
    says what failed, ``remedy`` what to do next; the sentence is both, joined by a semicolon."""

    def __init__(self, detail: str, remedy: str) -> None:
        super().__init__(f"{detail}; {remedy}", EXIT_PREFLIGHT)
        self.detail = detail
        self.remedy = remedy


class BrokerUnreachable(UserError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_BROKER)


class ReadOnlyRefused(UserError):
    """A dangerous action was asked of a read-only (watch) console: refused in the ops layer too."""

    def __init__(self, action: str) -> None:
        super().__init__(
            f"Refused to {action}: this console is read-only (watch mode), nothing was changed; "
            "run the action from `celeryops` without `watch`.", EXIT_USAGE)
        self.action = action
