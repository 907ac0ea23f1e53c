"""The drain fence of the run this process holds (``celeryops.fence.FenceStore`` underneath): raised before the
first stop, renewed every third of its TTL while the run lives, widened during a deploy so the new release's
workers consume, parked (a long TTL, no renewal) when a drained run outlives its process, lifted at the end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import redis

from celeryops.core.aio import cancel_and_wait
from celeryops.core.events import Event, Notice
from celeryops.core.runsettings import RunSettings
from celeryops.fence import FenceStore
from celeryops.ops.drain.retry import keep_trying


class RunFence:
    def __init__(self, store: FenceStore, run_id: str | None, settings: RunSettings,
                 emit: Callable[[Event], None]) -> None:
        self.store = store
        self.run_id = run_id  # None: a fence lifted after the fact (abort of another process's run)
        self.settings = settings
        self.emit = emit
        self._keeper: asyncio.Future[None] | None = None

    async def raise_(self, queues: tuple[str, ...], by: str, *, only_revisions: tuple[str, ...] = (),
                     exempt_revisions: tuple[str, ...] = ()) -> None:
        """Before the first cancel broadcast: plugin workers (also ones that start later) hold these queues; with
        ``only_revisions``, only the workers of those Cloud Run revisions do (an overlap deploy's old revision), and
        ``exempt_revisions`` never do (its new revision, also for a plugin too old to know ``only_revisions``)."""
        if self.run_id is None:
            return
        run_id = self.run_id
        try:
            await asyncio.to_thread(lambda: self.store.raise_fence(
                run_id, list(queues), by, self.settings.fence_ttl, exempt_revisions=list(exempt_revisions),
                only_revisions=list(only_revisions)))
        except redis.RedisError as exc:
            self.emit(Notice(level="warning", message=f"Could not raise the drain fence ({exc}); the re-broadcast "
                                                      "still stops workers."))
            return
        if self._keeper is None:
            self._keeper = asyncio.ensure_future(self._keep())

    async def _keep(self) -> None:
        assert self.run_id is not None
        while True:
            await asyncio.sleep(self.settings.fence_ttl / 3)
            with contextlib.suppress(redis.RedisError):
                await asyncio.to_thread(self.store.renew, self.run_id, self.settings.fence_ttl)

    async def stop_keeping(self) -> None:
        keeper, self._keeper = self._keeper, None
        await cancel_and_wait(keeper)

    async def exempt(self, versions: list[str], revisions: list[str]) -> None:
        """During a deploy: workers of the new release consume while the old ones stay held."""
        if self.run_id is None:
            return
        run_id = self.run_id
        with contextlib.suppress(redis.RedisError):
            record = await asyncio.to_thread(self.store.read)
            old_versions = set(getattr(record, "exempt_versions", ()) or ())
            old_revisions = set(getattr(record, "exempt_revisions", ()) or ())
            await asyncio.to_thread(
                lambda: self.store.rescope(run_id, exempt_versions=sorted(old_versions | {v for v in versions if v}),
                                           exempt_revisions=sorted(old_revisions | set(revisions))))

    async def park(self) -> None:
        """The run ends drained and stays open after this process: stop renewing the fence every ttl/3 and give
        it ``fence_parked_ttl`` instead, so plugin workers stay held until a deploy or ``abort`` lifts it."""
        await self.stop_keeping()
        if self.run_id is None:
            return
        try:
            await asyncio.to_thread(self.store.renew, self.run_id, self.settings.fence_parked_ttl)
        except redis.RedisError as exc:
            self.emit(Notice(level="warning", message=f"Could not keep the drain fence up after the drain ({exc}): "
                                                      "plugin workers resume within "
                                                      f"{self.settings.fence_ttl:g}s although the run stays drained; "
                                                      "run `celeryops abort` to end it."))

    async def lift(self, run_id: str | None = None) -> None:
        """Lift the fence of ``run_id`` (default: this run's); plugin workers consume again."""
        rid = run_id or self.run_id
        await self.stop_keeping()
        if rid is None:
            return
        # Redis may be restarting: the restore that follows needs the fence gone (a plugin worker that still saw
        # it would stop its queue again), so keep trying for a while, then say what is left.
        try:
            await keep_trying(lambda: asyncio.to_thread(self.store.lift, rid), redis.RedisError,
                              self.settings.recovery_patience)
        except redis.RedisError as exc:
            self.emit(Notice(level="warning", message=(
                f"Could not lift the drain fence ({exc}): plugin workers may hold their queues until Redis answers "
                "and the fence expires; `celeryops status` shows the fleet.")))
