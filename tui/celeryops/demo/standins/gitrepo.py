"""Real git repositories for tests and the demo: a bare "remote", the operator's clone, and a colleague's clone.

Commits carry ``GIT_AUTHOR_DATE``/``GIT_COMMITTER_DATE`` in the past, so freshness checks have something to judge.
The user's git configuration is ignored (``GIT_CONFIG_GLOBAL=/dev/null``, no system config), so the result is the
same on every machine.

    repos = GitFixture(tmp_path, branch="release").create(age=timedelta(days=3))
    repos.advance_remote()          # a colleague pushed: the operator's clone is now 1 commit behind
    repos.commit(repos.work, "wip")  # a local commit: ahead (and, after advance_remote, diverged)
"""

from __future__ import annotations

import os
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path


class GitFixture:
    """``remote`` (bare, the origin), ``work`` (the operator's clone) and ``other`` (someone else's clone)."""

    def __init__(self, root: str | os.PathLike[str], branch: str = "release", now: datetime | None = None) -> None:
        self.root = Path(root)
        self.branch = branch
        self.now = now or datetime.now(UTC)
        self.remote = self.root / "remote.git"
        self.work = self.root / "work"
        self.other = self.root / "other"
        self._counter = 0

    @property
    def remote_url(self) -> str:
        return self.remote.as_uri()

    def env(self, when: datetime | None = None) -> dict[str, str]:
        env = {
            **os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
            "GIT_AUTHOR_NAME": "Release Bot", "GIT_AUTHOR_EMAIL": "release@example.com",
            "GIT_COMMITTER_NAME": "Release Bot", "GIT_COMMITTER_EMAIL": "release@example.com",
        }
        if when is not None:
            stamp = f"@{int(when.timestamp())} +0000"
            env["GIT_AUTHOR_DATE"] = stamp
            env["GIT_COMMITTER_DATE"] = stamp
        return env

    def git(self, where: Path, *args: str, when: datetime | None = None) -> str:
        """Run git in ``where``; returns stdout, raises ``subprocess.CalledProcessError`` with stderr on failure."""
        done = subprocess.run(
            ["git", "-C", str(where), *args], env=self.env(when), capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
        return done.stdout.strip()

    def create(self, commits: int = 1, age: timedelta = timedelta(days=1)) -> GitFixture:
        """Bare remote + two clones; ``commits`` commits on the branch (the newest ``age`` old), pushed."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.git(self.root, "init", "--quiet", "--bare", f"--initial-branch={self.branch}", str(self.remote))
        self.git(self.root, "init", "--quiet", f"--initial-branch={self.branch}", str(self.work))
        self.git(self.work, "remote", "add", "origin", self.remote_url)
        for i in range(commits):
            self.commit(self.work, f"change {i + 1}", age=age + timedelta(hours=commits - 1 - i))
        self.push(self.work)
        self.git(self.root, "clone", "--quiet", "--branch", self.branch, self.remote_url, str(self.other))
        return self

    def commit(self, where: Path, message: str, *, age: timedelta | None = None, when: datetime | None = None) -> str:
        """Commit a one-line change in ``where`` dated ``when`` (or ``now - age``, default now); returns the sha."""
        stamp = when or (self.now - age if age is not None else self.now)
        self._counter += 1
        with (where / "CHANGES.txt").open("a", encoding="utf-8") as changes:
            changes.write(f"{self._counter}: {message}\n")
        self.git(where, "add", "CHANGES.txt")
        self.git(where, "commit", "--quiet", "-m", message, when=stamp)
        return self.git(where, "rev-parse", "HEAD")

    def push(self, where: Path, branch: str | None = None) -> None:
        self.git(where, "push", "--quiet", "origin", f"HEAD:refs/heads/{branch or self.branch}")

    def advance_remote(self, message: str = "colleague's change", age: timedelta = timedelta(hours=1)) -> str:
        """A commit pushed from ``other``: the remote moves on, ``work`` does not know yet. Returns the sha."""
        self.git(self.other, "pull", "--quiet", "--ff-only", "origin", self.branch)
        sha = self.commit(self.other, message, age=age)
        self.push(self.other)
        return sha

    def tip(self, where: Path | None = None) -> str:
        return self.git(where or self.work, "rev-parse", "HEAD")
