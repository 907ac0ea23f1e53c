"""Issue 28, the canary's outcome collector against real parts: a private redis-server (the broadcasts reach every
worker on the broker, so no other test's worker may hear them) and real Celery workers running the fence plugin,
one per revision (``CLOUD_RUN_WORKER_POOL_REVISION`` as Cloud Run sets it). Each task's outcome is credited to the
revision of the worker that ran it; task events are turned on where they were off and turned back afterwards only
there; a canary worker killed without leaving the registry counts as a crash.

The workers run the solo pool: a threads-pool worker of Celery 5.6.3 drops some of its buffered task events
(celery/celery#10434, a race between the pool's threads and the flush), which would make exact counts flaky."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import redis

from celeryops.adapters.canaryevents import OutcomeCollector, exception_type
from celeryops.core.canary import RevisionCounts
from celeryops.demo.standins.redis_server import RedisServer
from celeryops.fence import registry
from celeryops.ops.run.analysis.sources import crashed_workers, registry_revisions
from celeryops_harness.workers import WorkerProcess, control_app, wait_for

WAIT = 60.0
FENCE_APP = "celeryops_harness.fenceapp"
OLD, NEW = "pool-00001-old", "pool-00002-new"


class HeartbeatWorker(WorkerProcess):
    """A worker that sends worker heartbeats (so its event dispatcher exists) but no task events unless told:
    what ``enable_events`` can turn on, as on a production worker started without ``-E``."""

    def command(self) -> list[str]:
        return [arg for arg in super().command() if arg != "--without-heartbeat"]


def test_exception_types_from_event_reprs() -> None:
    assert exception_type("ValueError('boom')") == "ValueError"
    assert exception_type("KeyError('x')") == "KeyError"
    assert exception_type("myapp.errors.Oops(1)") == "Oops"
    assert exception_type("") == exception_type(None) == "Exception"


def test_outcomes_are_credited_to_the_revision_of_the_worker_that_ran_them(own_redis: RedisServer,
                                                                           tmp_path: Path) -> None:
    broker = own_redis.url
    client = redis.Redis.from_url(broker)
    app = control_app(broker)
    base_env = {"CELERYOPS_TEST_RECORD": broker, "CLOUD_RUN_WORKER_POOL": "pool", "CELERYOPS_FENCE_INTERVAL": "0.5",
                "CELERYOPS_FENCE_REGISTRY_TTL": "2"}
    old = WorkerProcess(broker, app=FENCE_APP, pool="solo", queues=["q-old"], log_dir=tmp_path,
                        env={**base_env, "CLOUD_RUN_WORKER_POOL_REVISION": OLD, "CELERYOPS_TEST_EVENTS": "1"})
    new = HeartbeatWorker(broker, app=FENCE_APP, pool="solo", queues=["q-new"], log_dir=tmp_path,
                          env={**base_env, "CLOUD_RUN_WORKER_POOL_REVISION": NEW})
    plain = WorkerProcess(broker, pool="solo", queues=["q-plain"], log_dir=tmp_path,  # no fence plugin
                          env={"CELERYOPS_TEST_RECORD": broker, "CELERYOPS_TEST_EVENTS": "1"})
    workers = (old, new, plain)
    collector: OutcomeCollector | None = None
    try:
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.wait_ready(app, timeout=WAIT)
        wait_for(lambda: {i.revision for i in registry.plugin_workers(client).values()} == {OLD, NEW}, WAIT,
                 "both workers in the fence registry")

        collector = OutcomeCollector(app, registry_revisions(client), resend=0.5).start()
        wait_for(lambda: new.nodename in collector.enabled_by_us and old.nodename in collector.already_on, WAIT,
                 "the new worker to say its events were off, the old one that they were on")

        def send(queue: str, name: str, *args: Any) -> None:
            app.send_task(name, args=args, queue=queue)

        for _ in range(3):
            send("q-old", "celeryops.testing.noop")
        send("q-old", "celeryops.testing.fail", "ValueError")
        for _ in range(2):
            send("q-new", "celeryops.testing.noop")
        send("q-new", "celeryops.testing.fail", "CanaryError")
        send("q-new", "celeryops.testing.fail", "CanaryError", 1)  # one retry, then the failure
        send("q-plain", "celeryops.testing.noop")  # a worker of no known revision

        def credited() -> dict[str, RevisionCounts]:
            return collector.counts() if collector else {}

        def settled() -> bool:
            counts = credited()
            return (OLD in counts and NEW in counts and "" in counts and counts[OLD].completed == 4
                    and counts[NEW].completed == 4 and counts[NEW].retried == 1 and counts[""].completed == 1)

        try:
            wait_for(settled, WAIT, "every outcome credited")
        except TimeoutError:
            raise AssertionError(f"credited after {WAIT} s: {credited()}") from None
        counts = credited()
        assert dict(counts[OLD].failed) == {"ValueError": 1} and counts[OLD].succeeded == 3
        assert dict(counts[NEW].failed) == {"CanaryError": 2} and counts[NEW].succeeded == 2
        assert (counts[OLD].retried, counts[NEW].retried) == (0, 1)
        assert len(counts[NEW].runtimes) == 2 and all(r >= 0 for r in counts[NEW].runtimes)
        assert counts[""].succeeded == 1 and collector.unattributed == 1
        by_task = collector.counts_by_task()
        assert dict(by_task[(NEW, "celeryops.testing.fail")].failed) == {"CanaryError": 2}
        assert by_task[(OLD, "celeryops.testing.noop")].succeeded == 3

        collector.stop()
        assert collector.restore_events() == [new.nodename]  # the new worker only, never the old one
        # the workers say where they are now: the new one was turned off again, the old one left on
        replies = app.control.enable_events(destination=[old.nodename, new.nodename], reply=True, timeout=5,
                                            limit=2)
        said = {host: answer["ok"] for reply in replies for host, answer in reply.items()}
        assert said == {new.nodename: "task events enabled", old.nodename: "task events already enabled"}

        # a canary worker killed without leaving the registry: a crash once its heartbeat expired
        assert crashed_workers(client, NEW) == ()
        new.signal(signal.SIGKILL)
        wait_for(lambda: crashed_workers(client, NEW) == (new.nodename,), WAIT, "the killed worker's heartbeat to "
                 "expire")
        assert crashed_workers(client, OLD) == ()
    finally:
        if collector is not None:
            collector.stop(restore=False)
        for worker in workers:
            worker.stop()
        app.close()
        client.close()
