"""The verdict of a chaos trial (``Verdict``), its record (``TrialResult``) and the table of a series (``summary``).

Once the fleet is left to finish: every task ran exactly once or is still in the broker's queue (``lost`` = ran zero
times and is nowhere; ``duplicated`` = ran twice; ``cut`` = started on a worker the trial SIGKILLed, or delivered to it
and acked there (the task apps use acks_late=False: Celery acks a task just before it runs, so a SIGKILL between
the two ends it with its worker), counted apart),
and every live worker consumes its queue (``stranded`` = a live worker that does not; a worker in its warm shutdown
after SIGTERM is on its way out, not stranded). Task runs are counted in the record Redis (``ct:runs:<id>``,
``ct:run:<id>``) by the workers' task apps.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

import redis

from celeryops_harness.chaos_amqp import queued_ids
from celeryops_harness.chaos_procs import TrialFleet
from celeryops_harness.workers import WorkerProcess, wait_for

#: The mark of a timed fault whose moment never came: the deploy ended first, and it hit the fleet afterwards (during
#: the operator's recovery), not where its plan put it.
NEVER_CAME = "(its moment never came: fired after the deploy)"


@dataclass
class TrialResult:
    seed: int
    faults: list[str]  # the faults that were injected (fired; NEVER_CAME marks one fired after its moment)
    skipped: list[str]  # planned but not fired (the deploy ended first, or no quiet moment to kill in came)
    tasks: int = 0
    once: int = 0
    queued: int = 0
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    stranded: list[str] = field(default_factory=list)
    cut: list[str] = field(default_factory=list)  # died with a worker the trial SIGKILLed (started or acked there)
    commands: list[tuple[str, int]] = field(default_factory=list)  # (command, exit code) in order
    anomalies: list[str] = field(default_factory=list)  # unexpected exit codes, recovery that needed a retry
    elapsed: float = 0.0
    log_dir: str = ""
    timings: dict[str, float] = field(default_factory=dict)  # seconds spent per step (setup, deploy, ...)
    fleet: str = "fenced"  # what the workers ran (FLEET_KINDS)
    broker: str = "redis"  # BROKERS
    strategy: str = "drain"  # STRATEGIES: a service deployed with a drain, or a worker pool with an overlap
    busy: list[str] = field(default_factory=list)  # instances the stand-in took away while a task ran on them
    held_back: int = 0  # checks before a kill that found a sent task on its way to a worker (kombu#305: waited)
    # canary trials: the verdicts the deploy reported (promote, rollback), the revision the pool ended on (at its
    # count), and workers of the new revision that still consumed once the canary was taken away
    verdicts: list[str] = field(default_factory=list)
    ending: str = ""  # "old" (rolled back, the canary taken away), "new" (promoted), else what the pool runs
    canary_consuming: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.stranded or self.canary_consuming)

    def line(self) -> str:
        cmds = " ".join(f"{c}={rc}" for c, rc in self.commands)
        verdict = "FAIL" if not self.ok else "ANOM" if self.anomalies else "ok"
        return (f"seed {self.seed:>5}  {verdict:<4}  tasks {self.tasks:>2} once {self.once:>2} queued {self.queued} "
                f"lost {len(self.lost)} dup {len(self.duplicated)} stranded {len(self.stranded)}"
                + (f" cut {len(self.cut)}" if self.cut else "")
                + (f" busy-taken {len(self.busy)}" if self.busy else "")
                + (f" held-back {self.held_back}" if self.held_back else "")
                + (f" canary-consuming {len(self.canary_consuming)}" if self.canary_consuming else "")
                + (f"  verdict {'/'.join(self.verdicts) or '-'} ended {self.ending}" if self.strategy == "canary"
                   else "")
                + (f"  ended {self.ending}" if self.strategy == "autoscale" else "") + "  "
                f"{self.elapsed:5.1f}s  faults [{', '.join(self.faults)}]"
                + (f"  not fired [{', '.join(self.skipped)}]" if self.skipped else "") + f"  {cmds}"
                + (f"  stranded: {'; '.join(self.stranded)}" if self.strategy == "autoscale" and self.stranded
                   else "")
                + (f"  anomalies: {'; '.join(self.anomalies)}" if self.anomalies else ""))


def summary(results: Iterable[TrialResult]) -> str:
    """The table ``make chaos`` prints: one line per trial, then the totals."""
    results = list(results)
    faults: dict[str, int] = {}
    for r in results:
        for f in r.faults:
            kind = f.split("@")[0].split("+")[0]
            faults[kind] = faults.get(kind, 0) + 1
    lines = [r.line() for r in results]
    lines.append("")
    kinds = sorted({r.fleet + ("/amqp" if r.broker == "amqp" else "") for r in results})
    strategies = sorted({r.strategy for r in results})
    lines.append(f"trials {len(results)}  strategy {'/'.join(strategies) or '-'}  workers {'/'.join(kinds) or '-'}  "
                 f"faults injected {sum(faults.values())} "
                 f"({', '.join(f'{k} {v}' for k, v in sorted(faults.items()))})")
    lines.append(f"tasks {sum(r.tasks for r in results)}  ran once {sum(r.once for r in results)}  "
                 f"still queued {sum(r.queued for r in results)}  lost {sum(len(r.lost) for r in results)}  "
                 f"duplicated {sum(len(r.duplicated) for r in results)}  "
                 f"stranded workers {sum(len(r.stranded) for r in results)}  "
                 f"instances taken away busy {sum(len(r.busy) for r in results)}  "
                 + (f"canary consuming after removal {sum(len(r.canary_consuming) for r in results)}  "
                    if "canary" in strategies else "") +
                 f"anomalies {sum(len(r.anomalies) for r in results)}")
    lines.append(f"kills held back while a sent task was on its way to a worker (kombu#305): "
                 f"{sum(r.held_back for r in results)} checks in {sum(1 for r in results if r.held_back)} trials")
    late = [str(r.seed) for r in results if any(f.endswith(NEVER_CAME) for f in r.faults)]
    unfired = [str(r.seed) for r in results if r.skipped]
    lines.append(f"faults whose moment never came: fired after the deploy in seeds {', '.join(late) or 'none'}; "
                 f"not fired in seeds {', '.join(unfired) or 'none'}")
    failing = [str(r.seed) for r in results if not r.ok]
    odd = [str(r.seed) for r in results if r.ok and r.anomalies]
    canary = [r for r in results if r.strategy == "canary"]
    if canary:
        verdicts = Counter(r.verdicts[-1] if r.verdicts else "none" for r in canary)
        endings = Counter(r.ending or "-" for r in canary)
        lines.append(f"canary trials {len(canary)}: last verdict {_counts(verdicts)}; the pool ended on "
                     f"{_counts(endings)} revision")
    lines.append(f"failing seeds (lost/duplicated/stranded): {', '.join(failing) if failing else 'none'}")
    lines.append(f"seeds with anomalies (exit codes, recovery dead ends): {', '.join(odd) if odd else 'none'}")
    return "\n".join(lines)


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(counter.items()))


class Verdict:
    """Judges one trial: its fleet, the queue its tasks went to, their ids, and the broker (Redis, or RabbitMQ with
    ``amqp``: the vhost URL)."""

    def __init__(self, fleet: TrialFleet, queue: str, ids: list[str], redis_url: str, amqp: str = "") -> None:
        self.fleet, self.queue, self.ids, self.redis_url, self.amqp = fleet, queue, ids, redis_url, amqp

    def consuming(self, workers: list[WorkerProcess]) -> dict[str, set[str]]:
        names = [w.nodename for w in workers]
        try:
            replies = self.fleet.app.control.inspect(destination=names, timeout=3,
                                                     limit=len(names)).active_queues() or {}
        except Exception:
            return {}
        return {w: {q["name"] for q in (qs or [])} for w, qs in replies.items()}

    def stranded(self) -> list[str]:
        leaving = {w.nodename for w in self.fleet.leaving()}
        live = [w for w in self.fleet.alive() if w.nodename not in leaving]
        if not live:
            return []
        seen = self.consuming(live)
        return sorted(w.nodename for w in live if self.queue not in seen.get(w.nodename, set()))

    def in_broker(self) -> set[str]:
        """Task ids still held by the broker: in the queue lists or delivered-but-unacked."""
        if self.amqp:
            return queued_ids(self.amqp, self.queue)
        return redis_held(self.redis_url, self.queue)

    def unacked(self) -> set[str]:
        """Redis: ids of delivered-but-unacked messages (back in the queue only after the visibility timeout)."""
        client = redis.Redis.from_url(self.redis_url, socket_timeout=5)
        try:
            return _unacked_ids(client)
        except redis.RedisError:
            return set()
        finally:
            client.close()

    def judge(self, record: redis.Redis, res: TrialResult) -> None:
        """Wait for the fleet to settle (bounded), then fill in ``res``: stranded workers and what each task became."""

        def counts() -> dict[str, int]:
            pipe = record.pipeline()
            for tid in self.ids:
                pipe.get(f"ct:runs:{tid}")
            return {tid: int(v or 0) for tid, v in zip(self.ids, pipe.execute(), strict=True)}

        fleet = self.fleet
        killed = {w.nodename for w in fleet.killed}

        def finished_all() -> bool:
            pipe = record.pipeline()
            for tid in self.ids:
                pipe.hmget(f"ct:run:{tid}", "finished", "worker")
            states = pipe.execute()
            if all(done or worker in killed for done, worker in states):
                return True
            # A killed worker's prefetched messages wait out the visibility timeout (Redis): held, not lost.
            stuck = self.unacked() if killed and not self.amqp else set()
            return all(done or worker in killed or tid in stuck
                       for tid, (done, worker) in zip(self.ids, states, strict=True))

        # A worker whose revision was replaced got SIGTERM: it stops answering during its warm shutdown, and it is
        # on its way out, not stranded. Wait for it to exit (a warm shutdown that never ends is a finding).
        with contextlib.suppress(TimeoutError):
            wait_for(lambda: not fleet.leaving(), 60, "replaced workers to finish their warm shutdown", step=0.2)
        res.anomalies.extend(f"{w.nodename} still alive 60 s after SIGTERM" for w in fleet.leaving())
        # Every other live worker consumes again (judged on one observation, the last one).
        last: list[str] = []

        def none_stranded() -> bool:
            nonlocal last
            last = self.stranded()
            return not last

        with contextlib.suppress(TimeoutError):
            wait_for(none_stranded, 30, "every live worker to consume", step=0.5)
        res.stranded = last
        if not res.stranded:
            with contextlib.suppress(TimeoutError):
                wait_for(finished_all, 60, "every task to finish", step=0.3)
        held = self.in_broker()
        runs = counts()
        res.tasks = len(self.ids)
        res.once = sum(1 for n in runs.values() if n == 1)
        res.duplicated = sorted(t for t, n in runs.items() if n > 1)
        res.queued = sum(1 for t, n in runs.items() if n == 0 and t in held)
        received = received_by(fleet.killed)  # delivered to a worker the trial SIGKILLed (its log says so)
        res.lost = sorted(t for t, n in runs.items() if n == 0 and t not in held and t not in received)
        res.cut = sorted([t for t, n in runs.items() if n == 1 and not record.hget(f"ct:run:{t}", "finished")
                          and record.hget(f"ct:run:{t}", "worker") in killed]
                         + [t for t, n in runs.items() if n == 0 and t not in held and t in received])


def redis_held(url: str, queue: str) -> set[str]:
    """Task ids a Redis broker holds: in ``queue``'s lists (its priority lists too), or delivered-but-unacked."""
    client = redis.Redis.from_url(url, socket_timeout=5)
    found: set[str] = set()
    try:
        for key in client.scan_iter(match=f"{queue}*"):
            if client.type(key) == b"list":
                for raw in client.lrange(key, 0, -1):
                    found.add(json.loads(raw).get("headers", {}).get("id", ""))
        found |= _unacked_ids(client)
    finally:
        client.close()
    return found


def received_by(workers: Iterable[WorkerProcess]) -> set[str]:
    """Task ids the workers' logs say they received (``Task NAME[ID] received``)."""
    ids: set[str] = set()
    for worker in workers:
        with contextlib.suppress(OSError):
            ids.update(_RECEIVED.findall(worker.log_path.read_text(errors="replace")))
    return ids


_RECEIVED = re.compile(r"Task [\w.]+\[([0-9a-f-]+)\] received")


def _unacked_ids(client: redis.Redis) -> set[str]:
    """Ids of the messages a Redis broker delivered and holds until they are acked (kombu's ``unacked`` hash)."""
    return {json.loads(raw)[0].get("headers", {}).get("id", "") for raw in client.hvals("unacked")}
