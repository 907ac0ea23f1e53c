"""A real terminal for the console's tests: a private tmux server (its own socket), and process liveness."""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest


class Tmux:
    """A private tmux server (its own socket) running one command in a 120x40 terminal."""

    def __init__(self, tmp: Path) -> None:
        self.socket = f"celeryops-test-{uuid.uuid4().hex[:8]}"
        self.session = "console"
        self.tmp = tmp

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30)

    def start(self, args: list[str], env: dict[str, str]) -> None:
        script = self.tmp / "console.sh"
        exports = "".join(f"export {k}='{v}'\n" for k, v in env.items() if "'" not in v and k.isidentifier())
        script.write_text(f"#!/bin/sh\n{exports}cd '{self.tmp}'\nexec {sys.executable} -m celeryops "
                          + " ".join(f"'{a}'" for a in args) + "\n")
        script.chmod(0o755)
        started = self.tmux("-f", "/dev/null", "new-session", "-d", "-s", self.session, "-x", "120", "-y", "40",
                            str(script))
        assert started.returncode == 0, started.stderr

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session).stdout

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.session, *keys)

    def close(self) -> None:
        self.tmux("kill-server")


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    if not shutil.which("tmux"):
        pytest.fail("the console's terminal tests need tmux")
    term = Tmux(tmp_path)
    yield term
    term.close()


def pid_alive(pid: int) -> bool:
    try:
        Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
