"""The git adapter against real repositories: a bare remote and clones with commits dated in the past."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from celeryops.adapters.gitrepo import (
    CommitNotFound,
    Divergence,
    GitNotInstalled,
    GitRepo,
    NotAGitRepository,
    RemoteMissing,
    RemoteUnreachable,
)
from celeryops.core.errors import EXIT_PREFLIGHT, UserError
from celeryops.demo.standins.gitrepo import GitFixture

NOW = datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)


@pytest.fixture
def repos(tmp_path: Path) -> GitFixture:
    return GitFixture(tmp_path, branch="release", now=NOW).create(commits=2, age=timedelta(days=3))


async def test_ls_remote_returns_the_branch_tip_or_none(repos: GitFixture) -> None:
    repo = GitRepo(repos.work)
    assert await repo.ls_remote("origin", "release") == repos.tip()
    assert await repo.ls_remote("origin", "no-such-branch") is None
    # a URL works as well as a remote name
    assert await repo.ls_remote(repos.remote_url, "release") == repos.tip()


async def test_ls_remote_does_not_match_a_branch_by_suffix(repos: GitFixture) -> None:
    repos.push(repos.work, "hotfix/release")
    repo = GitRepo(repos.work)
    assert await repo.ls_remote("origin", "release") == repos.tip()
    assert await repo.ls_remote("origin", "elease") is None


async def test_local_tip_of_branch_and_head(repos: GitFixture) -> None:
    repo = GitRepo(repos.work)
    assert await repo.local_tip("release") == repos.tip()
    assert await repo.local_tip() == repos.tip()
    assert await repo.local_tip("missing") is None
    assert await repo.current_branch() == "release"


async def test_commit_time_is_the_committer_date(repos: GitFixture) -> None:
    repo = GitRepo(repos.work)
    assert await repo.commit_time(repos.tip()) == NOW - timedelta(days=3)


async def test_commit_time_fetches_a_commit_that_is_only_on_the_remote(repos: GitFixture) -> None:
    new = repos.advance_remote(age=timedelta(hours=5))
    repo = GitRepo(repos.work)
    assert not await repo.has_commit(new)
    with pytest.raises(CommitNotFound):
        await repo.commit_time(new)  # without a remote to fetch from
    assert await repo.commit_time(new, "origin", "release") == NOW - timedelta(hours=5)
    assert await repo.has_commit(new)


async def test_divergence_in_sync_behind_ahead_diverged(repos: GitFixture) -> None:
    repo = GitRepo(repos.work)
    base = repos.tip()
    assert await repo.divergence(base, base, "origin", "release") == Divergence(0, 0)

    remote_tip = repos.advance_remote()
    behind = await repo.divergence(base, remote_tip, "origin", "release")  # fetches remote_tip first
    assert behind == Divergence(ahead=0, behind=1)
    assert behind.describe("local release", "origin/release") == "local release is 1 commit behind origin/release"

    local_tip = repos.commit(repos.work, "local work")
    diverged = await repo.divergence(local_tip, remote_tip, "origin", "release")
    assert diverged == Divergence(ahead=1, behind=1)
    assert "diverged (1 commit ahead, 1 commit behind)" in diverged.describe()

    second = repos.commit(repos.work, "more local work")
    assert (await repo.divergence(second, base, "origin", "release")).describe("a", "b") == "a is 2 commits ahead of b"


async def test_not_a_git_repository(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(NotAGitRepository) as err:
        await GitRepo(plain).ls_remote("origin", "release")
    assert isinstance(err.value, UserError) and err.value.exit_code == EXIT_PREFLIGHT
    assert "is not a git repository" in err.value.detail and err.value.remedy
    with pytest.raises(NotAGitRepository):
        await GitRepo(tmp_path / "does-not-exist").local_tip()


async def test_remote_missing(repos: GitFixture) -> None:
    with pytest.raises(RemoteMissing) as err:
        await GitRepo(repos.work).ls_remote("upstream", "release")
    assert "no remote named 'upstream'" in str(err.value)
    assert "git remote add upstream" in err.value.remedy


async def test_remote_unreachable(repos: GitFixture, tmp_path: Path) -> None:
    repos.git(repos.work, "remote", "add", "gone", (tmp_path / "gone.git").as_uri())
    with pytest.raises(RemoteUnreachable) as err:
        await GitRepo(repos.work).ls_remote("gone", "release")
    assert "could not list branches of remote gone" in err.value.detail
    assert "\n" not in str(err.value)


async def test_git_not_installed(repos: GitFixture) -> None:
    with pytest.raises(GitNotInstalled) as err:
        await GitRepo(repos.work, git="/nonexistent/bin/git").local_tip()
    assert "install git" in err.value.remedy


async def test_unknown_commit(repos: GitFixture) -> None:
    with pytest.raises(CommitNotFound) as err:
        await GitRepo(repos.work).commit_time("0" * 40, "origin", "release")
    assert "not even after fetching release from origin" in err.value.detail


async def test_fixture_dates_commits_in_the_past(repos: GitFixture) -> None:
    stamp = repos.git(repos.work, "log", "-1", "--format=%at %ct")
    assert stamp == f"{int((NOW - timedelta(days=3)).timestamp())} {int((NOW - timedelta(days=3)).timestamp())}"
    assert repos.git(repos.work, "rev-list", "--count", "HEAD") == "2"
