"""Gates that hold test tasks until the test releases them: a key in the record Redis (no Celery here, so an app
may use them without importing another app's tasks: Celery shares every ``@app.task`` with every app)."""

from __future__ import annotations

import redis

HOLD_LIMIT = 900.0  # seconds a hold runs at most if its test never releases it (beyond pytest's timeout)


def gate_key(gate: str) -> str:
    return f"ct:release:{gate}"


def release(client: redis.Redis, gate: str) -> None:
    """End every task holding on ``gate`` (now or later)."""
    client.set(gate_key(gate), 1)
