"""Shared fixtures: a private redis-server per test session, real Celery workers, a RabbitMQ vhost.

Nothing here mocks Redis or Celery. Waiting is done on conditions with deadlines (``wait_for``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from hypothesis import HealthCheck, settings

from celeryops.demo.standins.redis_server import RedisServer
from celeryops_harness.workers import WorkerProcess, control_app, kill_all, wait_for

AMQP_HOST = "127.0.0.1:5672"

# Property tests check results, not speed: no per-example deadline (a loaded machine stretches an example past
# Hypothesis's 200 ms, which it then reports as a failure or as "Unreliable test timings"), and slow generation of
# examples is no failure either. Loaded before the test modules, so their own @settings inherit it.
# The suite (CI) draws the same examples at every run (derandomize): a property that a new random draw breaks is found
# by exploring (`HYPOTHESIS_PROFILE=explore`, with fresh random examples each run and ten times as many), not by a CI
# run that fails once in a while.
settings.register_profile("celeryops", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "celeryops"))

# Keep test runs away from the operator's real state dir and config.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
os.environ.setdefault("CELERYOPS_STATE_DIR",
                      str(Path(os.environ.get("TMPDIR", "/tmp")) / f"celeryops-test-state-{os.getpid()}-{_worker}"))
# ... and its cache (the console's parsed stylesheets, console/csscache.py): each test process starts cold.
os.environ["XDG_CACHE_HOME"] = str(Path(os.environ.get("TMPDIR", "/tmp"))
                                   / f"celeryops-test-cache-{os.getpid()}-{_worker}")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.close()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The private server, emptied before each test (workers of a test are started after this)."""
    if not redis_server.running:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A redis-server of this test alone, for tests that stop and restart it."""
    server = RedisServer().start()
    yield server
    server.close()


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", "-q", *args], check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="session")
def amqp_vhost() -> Iterator[str]:
    """A private RabbitMQ vhost for this session: queues and the pidbox exchange of other runs never mix in."""
    if not shutil.which("rabbitmqctl"):
        pytest.fail("RabbitMQ tests need rabbitmqctl (RabbitMQ on 127.0.0.1:5672, guest/guest).")
    vhost = f"celeryops-test-{uuid.uuid4().hex[:8]}"
    _rabbitmqctl("add_vhost", vhost)
    _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    yield vhost
    subprocess.run(["rabbitmqctl", "-q", "delete_vhost", vhost], capture_output=True, timeout=60)


@pytest.fixture
def amqp_url(amqp_vhost: str) -> str:
    """The broker URL of this session's private RabbitMQ vhost."""
    return f"amqp://guest:guest@{AMQP_HOST}/{amqp_vhost}"


@pytest.fixture(params=["redis", pytest.param("amqp", marks=pytest.mark.amqp)])
def broker_url(request: pytest.FixtureRequest) -> str:
    """Parametrizes a test over the Redis broker and the AMQP broker."""
    if request.param == "redis":
        return str(request.getfixturevalue("redis_url"))
    vhost = request.getfixturevalue("amqp_vhost")
    # Record store stays Redis.
    request.getfixturevalue("redis_url")
    return f"amqp://guest:guest@{AMQP_HOST}/{vhost}"


@pytest.fixture
def celery_app(broker_url: str) -> Iterator[Celery]:
    app = control_app(broker_url)
    yield app
    app.close()


@pytest.fixture
def redis_control(redis_url: str) -> Iterator[Celery]:
    """A control app on the private Redis: remote control of the test's workers."""
    app = control_app(redis_url)
    yield app
    app.close()


@pytest.fixture
def queue_name() -> str:
    return f"q-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def start_workers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., list[WorkerProcess]]]:
    """Factory: ``start_workers(broker, n=2, **WorkerProcess kwargs)`` starts n real workers and waits until
    each answers ping. All are stopped (process group, SIGKILL at worst) at teardown."""
    started: list[WorkerProcess] = []
    record_url = request.getfixturevalue("redis_url")

    def start(broker: str, n: int = 1, wait: bool = True, **kw: Any) -> list[WorkerProcess]:
        env = {"CELERYOPS_TEST_RECORD": record_url, **kw.pop("env", {})}
        batch = [WorkerProcess(broker, env=env, log_dir=tmp_path, **kw).start() for _ in range(n)]
        started.extend(batch)
        if wait:
            app = control_app(broker)
            try:
                for w in batch:
                    w.wait_ready(app)
            finally:
                app.close()
        return batch

    yield start
    kill_all(started)


__all__ = ["control_app", "wait_for"]
