"""Real parts for tests, benchmarks and the demo: a private redis-server, Celery worker processes,
a task app with tasks of controllable duration, and (later) the local Cloud Run stand-in."""
