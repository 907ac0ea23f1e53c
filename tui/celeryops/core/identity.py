"""Who runs this process, as the journal, the run lease and the fence record it."""

from __future__ import annotations

import getpass
import os


def current_user() -> str:
    """The operator's login name; without one (no passwd entry, no ``$USER``), the numeric uid."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"
