"""Fixed canary data for snapshots and the preview (:mod:`celeryops.console.sample`'s fleet and revisions): a
canary of the new revision beside the old one, judged look by look by the real judge over fixed counts."""

from __future__ import annotations

from celeryops.console.sample import NEW_REV, OLD_REV
from celeryops.core.canary import CanarySettings, RevisionCounts
from celeryops.core.canarylook import CanaryLook
from celeryops.core.events import PhaseChanged
from celeryops.ops.run.analysis.look import look_event
from celeryops.ops.run.analysis.rules import judge

SETTINGS = CanarySettings(min_tasks=50, max_duration=900.0, look_interval=30.0)
#: (task name, share of the tasks, runtime base in seconds, exception type its failures raise)
TASKS = (("media.transcode", 5, 4.2, "FFmpegError"), ("reports.build_monthly", 3, 38.0, "TimeoutError"),
         ("ml.embed_batch", 2, 0.35, "CUDAOutOfMemory"))


def _counts(completed: int, failures: int, salt: int) -> dict[str, RevisionCounts]:
    """``completed`` tasks over :data:`TASKS` by their shares, ``failures`` of them failed (the first task name's
    first), deterministic runtimes."""
    total_share = sum(share for _, share, _, _ in TASKS)
    out: dict[str, RevisionCounts] = {}
    left_failures = failures
    for i, (name, share, base, error) in enumerate(TASKS):
        n = completed * share // total_share if i < len(TASKS) - 1 else completed - sum(
            completed * s // total_share for _, s, _, _ in TASKS[:-1])
        failed = min(n, left_failures if i == 0 else (left_failures + 1) // 2)
        left_failures -= failed
        runtimes = tuple(round(base * (0.6 + ((k * 37 + salt) % 23) / 20), 3) for k in range(n - failed))
        out[name] = RevisionCounts(succeeded=n - failed, failed={error: failed} if failed else {},
                                   retried=(n // 17), runtimes=runtimes)
    return out


def canary_look(look: int, baseline: tuple[int, int], canary: tuple[int, int], *, paused: bool = False) -> CanaryLook:
    """Look ``look`` with ``baseline`` and ``canary`` (completed, failed) tasks, judged by the real judge."""
    by_task = {**{(OLD_REV, name): c for name, c in _counts(*baseline, salt=3).items()},
               **{(NEW_REV, name): c for name, c in _counts(*canary, salt=11).items()}}
    by_revision: dict[str, RevisionCounts] = {}
    for (revision, _), counts in by_task.items():
        by_revision[revision] = by_revision.get(revision, RevisionCounts()) + counts
    judgement = judge(by_revision[OLD_REV], by_revision[NEW_REV], crashes=0, look=look,
                      elapsed=look * SETTINGS.look_interval, settings=SETTINGS)
    return look_event(judgement, target="worker-pool", baseline=OLD_REV, canary=NEW_REV, by_revision=by_revision,
                      by_task=by_task, paused=paused)


def canary_script() -> list[object]:
    """A canary four looks in: the canary has failed a little more often than the baseline, not beyond chance, and
    has not done the tasks a promotion needs yet."""
    return [PhaseChanged("overlapping", "the canary consumes beside the old revision"),
            canary_look(1, (96, 1), (9, 0)), canary_look(2, (201, 2), (19, 1)), canary_look(3, (298, 3), (27, 1)),
            canary_look(4, (412, 5), (38, 2))]
