"""Issue 34: queue depths on Redis are read in one pipelined round trip on the broker link's held client (they were
four LLEN round trips per queue on a fresh kombu connection at every poll). They must read what kombu's own
transport reads: messages sent by Celery at every priority, with and without the transport's ``global_keyprefix``,
on a real redis-server; a key that is not a list (or a broker that does not answer) reads as unknown, not 0."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
from celery import Celery

from celeryops.adapters.brokerlink import BrokerLink


def kombu_depth(app: Celery, queue: str) -> int:
    """What kombu's Redis transport says is waiting in ``queue`` (its own client, its own prefix)."""
    with app.connection_for_write() as conn:
        return int(conn.default_channel._size(queue))


@pytest.mark.parametrize("prefix", ["", "pfx:"])
def test_depths_read_what_kombu_reads_at_every_priority(redis_url: str, redis_client: redis.Redis,
                                                         prefix: str) -> None:
    app = Celery("depths", broker=redis_url, set_as_current=False)
    app.conf.broker_transport_options = {"global_keyprefix": prefix} if prefix else {}
    queues = [f"depth-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    sent = {queues[0]: [None, 0, 4, 9, 9], queues[1]: [5], queues[2]: []}
    for queue, priorities in sent.items():
        for priority in priorities:
            app.send_task("celeryops.testing.sleep", args=(0.1, queue), queue=queue, priority=priority)
    not_a_list = f"depth-{uuid.uuid4().hex[:8]}"
    redis_client.set(prefix + not_a_list, "x")
    link = BrokerLink(app)
    try:
        depths = {d.queue: d.messages for d in asyncio.run(link.queue_depths([*queues, not_a_list]))}
        assert depths == {**{q: kombu_depth(app, q) for q in queues}, not_a_list: None}
        assert [depths[q] for q in queues] == [5, 1, 0]
    finally:
        link.close()
        app.close()
        redis_client.delete(prefix + not_a_list)
        for queue in queues:
            for step in ("", "\x06\x163", "\x06\x166", "\x06\x169"):
                redis_client.delete(prefix + queue + step)


def test_an_unreachable_broker_reads_as_unknown() -> None:
    app = Celery("depths", broker="redis://127.0.0.1:9/0", set_as_current=False)  # nothing listens on port 9
    link = BrokerLink(app)
    try:
        assert [d.messages for d in asyncio.run(link.queue_depths(["a", "b"]))] == [None, None]
    finally:
        link.close()
        app.close()
