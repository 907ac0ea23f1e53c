"""A KEDA/CREMA-like scaler for a Cloud Run worker pool: bench_autoscale's anchor (issue 36).

What Google's CREMA does with KEDA's Redis list scaler, reduced to its rules:

- the metric is the Redis list length of the queue (``LLEN``: KEDA's ``redis`` scaler, ``listLength`` the target
  per instance); the tasks the workers hold (prefetched, running) are not in it;
- the desired count is ``ceil(LLEN / listLength)`` (the HPA's ``AverageValue`` rule), within min and max;
- scale out at once; scale in only to the highest count desired over the last ``cooldown`` seconds (the HPA's
  scale-down stabilization window; KEDA's cooldownPeriod before going to zero);
- the count is set by updating the worker pool's ``scaling.manual_instance_count`` through the real Cloud Run
  client (``google.cloud.run_v2.WorkerPoolsClient``), which is all a worker pool offers: Cloud Run then takes away
  instances of its choice, SIGTERM and SIGKILL 10 s later (the stand-in draws them at random).

An update refused because the previous one still rolls out (FAILED_PRECONDITION) is tried again at the next look,
as a reconcile loop does. Every decision is kept in ``decisions`` (time, LLEN, desired, count set).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass

import grpc
import redis
from google.api_core import exceptions as gexc
from google.cloud import run_v2
from google.cloud.run_v2.services.worker_pools.transports import WorkerPoolsGrpcTransport


@dataclass(frozen=True)
class Decision:
    at: float  # time.time()
    length: int  # LLEN of the queue
    desired: int
    count: int  # the manual_instance_count set (or kept)


class KedaLikeScaler:
    """Sizes the worker pool ``pool`` (full name) on the stand-in at ``endpoint`` from ``LLEN queue`` on ``broker``
    (see the module docstring); ``start()`` then ``stop()``."""

    def __init__(self, endpoint: str, pool: str, broker: str, queue: str, *, min_instances: int, max_instances: int,
                 interval: float, cooldown: float, list_length: int = 1) -> None:
        self.endpoint, self.pool, self.broker, self.queue = endpoint, pool, broker, queue
        self.min, self.max = min_instances, max_instances
        self.interval, self.cooldown, self.list_length = interval, cooldown, max(1, list_length)
        self.decisions: list[Decision] = []
        self.refused = 0  # updates refused while the previous one rolled out (tried again at the next look)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="keda-like")

    def start(self) -> KedaLikeScaler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def desired(self, length: int) -> int:
        return min(self.max, max(self.min, math.ceil(length / self.list_length)))

    def _run(self) -> None:
        client = redis.Redis.from_url(self.broker, socket_timeout=5)
        channel = grpc.insecure_channel(self.endpoint)
        pools = run_v2.WorkerPoolsClient(transport=WorkerPoolsGrpcTransport(channel=channel))
        window: deque[tuple[float, int]] = deque()
        try:
            while not self._stop.wait(self.interval):
                try:
                    length = int(client.llen(self.queue))
                except redis.RedisError:
                    continue  # no metric this time: the HPA keeps the count
                now = time.monotonic()
                desired = self.desired(length)
                window.append((now, desired))
                while window and window[0][0] < now - self.cooldown:
                    window.popleft()
                self._reconcile(pools, length, desired, max(d for _, d in window))
        finally:
            channel.close()
            client.close()

    def _reconcile(self, pools: run_v2.WorkerPoolsClient, length: int, desired: int, stabilized: int) -> None:
        try:
            pool = pools.get_worker_pool(name=self.pool, retry=None, timeout=10)
        except gexc.GoogleAPICallError:
            return
        current = int(pool.scaling.manual_instance_count)
        count = desired if desired > current else min(current, stabilized)
        if count != current:
            pool.scaling.manual_instance_count = count
            try:
                pools.update_worker_pool(worker_pool=pool, retry=None, timeout=10)
            except gexc.FailedPrecondition:  # the previous update still rolls out
                self.refused += 1
                return
            except gexc.GoogleAPICallError:
                return
        self.decisions.append(Decision(time.time(), length, desired, count))
