"""RabbitMQ for chaos trials (``ChaosLab(broker="amqp")``): one private vhost per trial on the local RabbitMQ
(127.0.0.1:5672, guest/guest), and the verdict's "still in the broker" read from the queue itself.

On RabbitMQ the trial's Redis (the crash-prone ``redis-server`` of the Redis trials) still holds the run lease, the
published status and the fence: a "Redis restarts" fault then crashes the coordination Redis, not the broker.
"""

from __future__ import annotations

import subprocess
import uuid

from celery import Celery

AMQP_HOST = "127.0.0.1:5672"


def _ctl(*args: str, check: bool = True) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=check, capture_output=True, timeout=60)


def create_vhost(tag: str) -> str:
    """A fresh vhost for one trial; returns the broker URL."""
    vhost = f"celeryops-chaos-{tag}-{uuid.uuid4().hex[:4]}"
    _ctl("add_vhost", vhost)
    _ctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    return f"amqp://guest:guest@{AMQP_HOST}/{vhost}"


def delete_vhost(url: str) -> None:
    _ctl("delete_vhost", url.rsplit("/", 1)[-1], check=False)


def queued_ids(url: str, queue: str, limit: int = 10_000) -> set[str]:
    """Task ids waiting in ``queue``: read with basic_get and never acknowledged (closing the channel puts every
    message back). Delivered-but-unacked messages are back in the queue as soon as their worker's connection closed."""
    found: set[str] = set()
    app = Celery("celeryops_chaos_queued", broker=url, set_as_current=False)
    with app.connection_for_write() as conn:
        channel = conn.channel()
        try:
            for _ in range(limit):
                message = channel.basic_get(queue, no_ack=False)
                if message is None:
                    break
                found.add(str((message.headers or {}).get("id", "")))
        except Exception:  # no such queue: nothing waits in it
            pass
        finally:
            try:
                channel.close()
            except Exception:
                pass
    app.close()
    return found
