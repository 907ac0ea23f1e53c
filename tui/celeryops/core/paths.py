"""Where celeryops keeps its local state (the run journal)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def state_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """``--state-dir``/config value, else ``$CELERYOPS_STATE_DIR``, else the platform's user state dir."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get("CELERYOPS_STATE_DIR")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_state_dir("celeryops", appauthor=False))
