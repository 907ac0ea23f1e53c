"""What the console's release picker lists: the remote's release branches (``[release] branches``; by default every
branch but the remote's default one), newest first, each with its tip commit, its age and whether the image every
target would deploy exists (the registry probes of the preflight's ``image`` check, per release). Reads only:
``ls-remote``, a fetch of tip commits not local yet, and registry manifest lookups."""

from __future__ import annotations

import asyncio
from pathlib import Path

from celeryops.adapters.gitrepo import GitRepo, remote_branches
from celeryops.adapters.registry import ImageRegistry
from celeryops.core.config import Config, Target
from celeryops.ops.backend.views import ImageState, ReleasesView, ReleaseView

MAX_RELEASES = 30  # the newest ones; the picker's / filter narrows them down
_PROBES_AT_ONCE = 8


async def list_releases(config: Config, repo: Path, targets: tuple[Target, ...] | None = None,
                        registry: ImageRegistry | None = None, limit: int = MAX_RELEASES) -> ReleasesView:
    """The release branches of ``config.release.remote`` as seen from the checkout ``repo``. Git problems raise
    ``GitError`` (a ``UserError``: one sentence with what to do)."""
    rel = config.release
    branches = (await remote_branches(GitRepo(repo), rel.remote, rel.is_release))[:limit]
    deployed = [t for t in (config.targets if targets is None else targets) if t.image]
    client = registry or ImageRegistry()
    gate = asyncio.Semaphore(_PROBES_AT_ONCE)

    async def image(name: str, sha: str) -> tuple[ImageState, str]:
        if not deployed:
            return "none", "no target has an image"
        refs = list(dict.fromkeys(t.image_for(sha, name, name) for t in deployed))
        async with gate:
            probes = await asyncio.gather(*(client.probe(ref) for ref in refs))
        bad = [p for p in probes if not p.exists]
        if not bad:
            return "exists", probes[0].detail if len(probes) == 1 else f"all {len(probes)} images exist"
        # a missing manifest is "missing"; a refused or unreachable registry is "unknown" (the preflight's image
        # check, the same probes, says which when this release is picked)
        state: ImageState = "missing" if any(p.status == "missing" for p in bad) else "unknown"
        return state, "; ".join(p.detail for p in bad)

    images = await asyncio.gather(*(image(b.name, b.sha) for b in branches))
    pattern = f"branches matching {rel.branches}" if rel.branches else "every branch but the default one"
    return ReleasesView(
        releases=tuple(ReleaseView(b.name, b.sha, b.committed.timestamp() if b.committed else None, b.subject,
                                   state, detail) for b, (state, detail) in zip(branches, images, strict=True)),
        remote=rel.remote, pattern=pattern)
