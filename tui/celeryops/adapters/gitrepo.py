"""Git adapter for preflight: what does the remote release branch point at, and how does the checkout compare?

Runs the ``git`` binary through asyncio subprocesses (never a shell, never an interactive prompt). Reads only:
the one write it may do is ``git fetch`` of the release branch, when a commit it must inspect is not local yet.
Problems come out as ``GitError`` (a ``UserError``) with a ``detail`` sentence and a ``remedy`` sentence:
git not installed, not a git repository, no such remote, remote unreachable, unknown commit.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from celeryops.core.errors import PreflightError
from celeryops.core.masking import mask_text

_SHA_RE = re.compile(r"^[0-9a-f]{40}(?:[0-9a-f]{24})?$")
_URL_LIKE = re.compile(r"^(?:[a-z][a-z0-9+.-]*://|[^/\s]+@[^/\s]+:|/|\.{1,2}/|~)", re.IGNORECASE)


class GitError(PreflightError):
    """A git problem the operator can fix. ``detail``: what failed; ``remedy``: what to do next."""


class GitNotInstalled(GitError):
    pass


class NotAGitRepository(GitError):
    pass


class RemoteMissing(GitError):
    pass


class RemoteUnreachable(GitError):
    pass


class CommitNotFound(GitError):
    pass


@dataclass(frozen=True)
class Divergence:
    """How a local tip relates to the remote tip: commits only local (ahead) and only remote (behind)."""

    ahead: int
    behind: int

    @property
    def in_sync(self) -> bool:
        return self.ahead == 0 and self.behind == 0

    def describe(self, local: str = "local", remote: str = "remote") -> str:
        """``"local release is 2 commits behind origin/release"`` and the like (one phrase, no trailing dot)."""
        if self.in_sync:
            return f"{local} matches {remote}"
        if self.ahead and self.behind:
            return f"{local} and {remote} have diverged ({_commits(self.ahead)} ahead, {_commits(self.behind)} behind)"
        if self.ahead:
            return f"{local} is {_commits(self.ahead)} ahead of {remote}"
        return f"{local} is {_commits(self.behind)} behind {remote}"


def _commits(n: int) -> str:
    return f"{n} commit" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class _Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def first_error_line(self) -> str:
        for line in self.stderr.splitlines():
            line = line.strip()
            if line:
                return mask_text(line.removeprefix("fatal: ").removeprefix("error: "))
        return f"git exited with status {self.returncode}"


class GitRepo:
    """A local checkout. ``path`` may be any directory inside the work tree."""

    def __init__(self, path: str | os.PathLike[str], *, git: str = "git", timeout: float = 60.0) -> None:
        self.path = Path(path)
        self.git = git
        self.timeout = timeout

    async def _run(self, *args: str) -> _Result:
        if not self.path.is_dir():
            raise NotAGitRepository(
                f"{self.path} is not a directory, so it is not a git repository",
                "run celeryops from your project's checkout or point it at one",
            )
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C", "GIT_OPTIONAL_LOCKS": "0"}
        try:
            proc = await asyncio.create_subprocess_exec(
                self.git, "-C", str(self.path), *args,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env=env,
            )
        except FileNotFoundError:
            raise GitNotInstalled(
                f"the git program ({self.git}) was not found", "install git (apt-get install git) and try again"
            ) from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise RemoteUnreachable(
                f"git {args[0]} did not finish within {self.timeout:g} seconds",
                "check the network and the remote's address, then try again",
            ) from None
        except asyncio.CancelledError:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            raise
        return _Result(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))

    async def ensure_repo(self) -> None:
        """Raise ``NotAGitRepository`` unless ``path`` is inside a git repository."""
        result = await self._run("rev-parse", "--git-dir")
        if result.returncode != 0:
            raise NotAGitRepository(
                f"{self.path} is not a git repository", "run celeryops from your project's checkout or point it at one"
            )

    async def _ensure_remote(self, remote: str) -> None:
        await self.ensure_repo()
        if _URL_LIKE.match(remote):
            return
        result = await self._run("remote", "get-url", remote)
        if result.returncode != 0:
            raise RemoteMissing(
                f"the repository at {self.path} has no remote named {remote!r}",
                f"add it (git remote add {remote} URL) or configure the right remote name",
            )

    async def ls_remote(self, remote: str, branch: str) -> str | None:
        """The sha the remote's ``refs/heads/<branch>`` points at, or None if the remote has no such branch."""
        await self._ensure_remote(remote)
        result = await self._run("ls-remote", "--heads", remote, f"refs/heads/{branch}")
        if result.returncode != 0:
            raise RemoteUnreachable(
                f"could not list branches of remote {mask_text(remote)}: {result.first_error_line}",
                "check the network, the remote's address and your access to it, then try again",
            )
        for line in result.stdout.splitlines():
            sha, _, ref = line.partition("\t")
            if ref.strip() == f"refs/heads/{branch}":
                return sha.strip()
        return None

    async def local_tip(self, branch: str | None = None) -> str | None:
        """The sha of local branch ``branch`` (None if there is no such branch), or of HEAD when branch is None."""
        await self.ensure_repo()
        ref = f"refs/heads/{branch}^{{commit}}" if branch else "HEAD^{commit}"
        result = await self._run("rev-parse", "--verify", "--quiet", ref)
        return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else None

    async def current_branch(self) -> str | None:
        """The checked-out branch, or None on a detached HEAD."""
        await self.ensure_repo()
        result = await self._run("symbolic-ref", "--quiet", "--short", "HEAD")
        return result.stdout.strip() or None if result.returncode == 0 else None

    async def has_commit(self, sha: str) -> bool:
        await self.ensure_repo()
        result = await self._run("cat-file", "-e", f"{sha}^{{commit}}")
        return result.returncode == 0

    async def fetch(self, remote: str, branch: str) -> None:
        """Fetch the remote branch's objects (updates ``FETCH_HEAD`` and the remote-tracking ref only)."""
        await self._ensure_remote(remote)
        result = await self._run("fetch", "--quiet", "--no-tags", remote, f"refs/heads/{branch}")
        if result.returncode != 0:
            raise RemoteUnreachable(
                f"could not fetch {branch} from {mask_text(remote)}: {result.first_error_line}",
                "check the network and your access to the remote, then try again",
            )

    async def ensure_commit(self, sha: str, remote: str | None = None, branch: str | None = None) -> None:
        """Make sure ``sha`` is local, fetching ``branch`` from ``remote`` first if it is not."""
        if await self.has_commit(sha):
            return
        if remote is not None and branch is not None:
            await self.fetch(remote, branch)
            if await self.has_commit(sha):
                return
        where = f" (not even after fetching {branch} from {remote})" if remote and branch else ""
        raise CommitNotFound(
            f"commit {sha[:12]} is not in the repository at {self.path}{where}",
            "check that the branch was not force-pushed meanwhile, then run preflight again",
        )

    async def commit_time(self, sha: str, remote: str | None = None, branch: str | None = None) -> datetime:
        """The committer date of ``sha`` (UTC), fetching ``branch`` from ``remote`` first if the commit is not local."""
        await self.ensure_commit(sha, remote, branch)
        result = await self._run("show", "-s", "--format=%ct", f"{sha}^{{commit}}")
        stamp = result.stdout.strip()
        if result.returncode != 0 or not stamp.isdigit():
            raise CommitNotFound(
                f"could not read the date of commit {sha[:12]}: {result.first_error_line}",
                "check the repository's health (git fsck), then try again",
            )
        return datetime.fromtimestamp(int(stamp), tz=UTC)

    async def commit_subject(self, sha: str) -> str:
        """The first line of the commit message (empty if unknown)."""
        result = await self._run("show", "-s", "--format=%s", f"{sha}^{{commit}}")
        return result.stdout.strip() if result.returncode == 0 else ""

    async def divergence(self, local_sha: str, remote_sha: str, remote: str, branch: str) -> Divergence:
        """Commits only in ``local_sha`` (ahead) and only in ``remote_sha`` (behind); fetches the remote if needed."""
        await self.ensure_commit(local_sha)
        await self.ensure_commit(remote_sha, remote, branch)
        result = await self._run("rev-list", "--left-right", "--count", f"{local_sha}...{remote_sha}")
        fields = result.stdout.split()
        if result.returncode != 0 or len(fields) != 2:
            raise CommitNotFound(
                f"could not compare {local_sha[:12]} with {remote_sha[:12]}: {result.first_error_line}",
                "check the repository's health (git fsck), then try again",
            )
        return Divergence(ahead=int(fields[0]), behind=int(fields[1]))


@dataclass(frozen=True)
class RemoteBranch:
    """A branch of the remote: its tip, and the tip commit's date (UTC) and subject once it was read."""

    name: str
    sha: str
    committed: datetime | None = None
    subject: str = ""


class _Listing:
    """``GitRepo.remote_branches`` in pieces (kept apart so GitRepo stays a list of one-git-call methods)."""

    @staticmethod
    def parse(stdout: str) -> tuple[str | None, list[RemoteBranch]]:
        default: str | None = None
        branches: list[RemoteBranch] = []
        for line in stdout.splitlines():
            if line.startswith("ref: "):  # --symref: "ref: refs/heads/main\tHEAD"
                target, _, name = line[5:].partition("\t")
                if name.strip() == "HEAD" and target.startswith("refs/heads/"):
                    default = target.removeprefix("refs/heads/")
                continue
            sha, _, ref = line.partition("\t")
            ref = ref.strip()
            if ref.startswith("refs/heads/"):
                branches.append(RemoteBranch(ref.removeprefix("refs/heads/"), sha.strip()))
        return default, branches


async def remote_branches(repo: GitRepo, remote: str, keep: Callable[[str, str | None], bool]) -> list[RemoteBranch]:
    """The remote's branches that ``keep(name, default_branch)`` selects, newest tip commit first, each with its
    commit date and subject. One ``ls-remote`` and, when some tip commits are not local yet, one ``fetch`` of those
    branches (into the remote-tracking refs only), then one ``log --no-walk`` for every tip."""
    await repo._ensure_remote(remote)
    listed = await repo._run("ls-remote", "--symref", remote, "HEAD", "refs/heads/*")
    if listed.returncode != 0:
        raise RemoteUnreachable(
            f"could not list branches of remote {mask_text(remote)}: {listed.first_error_line}",
            "check the network, the remote's address and your access to it, then try again",
        )
    default, branches = _Listing.parse(listed.stdout)
    chosen = [b for b in branches if keep(b.name, default)]
    if not chosen:
        return []
    missing = [b for b in chosen if not await repo.has_commit(b.sha)]
    if missing:
        tracking = "refs/remotes/" + remote if not _URL_LIKE.match(remote) else "refs/celeryops/releases"
        specs = [f"+refs/heads/{b.name}:{tracking}/{b.name}" for b in missing]
        fetched = await repo._run("fetch", "--quiet", "--no-tags", remote, *specs)
        if fetched.returncode != 0:
            raise RemoteUnreachable(
                f"could not fetch the release branches from {mask_text(remote)}: {fetched.first_error_line}",
                "check the network and your access to the remote, then try again",
            )
    shown = await repo._run("log", "--no-walk=unsorted", "--format=%H %ct %s", *(b.sha for b in chosen), "--")
    info: dict[str, tuple[datetime, str]] = {}
    for line in shown.stdout.splitlines():
        sha, _, rest = line.partition(" ")
        stamp, _, subject = rest.partition(" ")
        if stamp.isdigit():
            info[sha] = (datetime.fromtimestamp(int(stamp), tz=UTC), subject)
    out = [RemoteBranch(b.name, b.sha, *info.get(b.sha, (None, ""))) for b in chosen]
    epoch = datetime.fromtimestamp(0, tz=UTC)
    return sorted(out, key=lambda b: (b.committed or epoch, b.name), reverse=True)


def short_sha(sha: str) -> str:
    return sha[:12] if _SHA_RE.match(sha) else sha
