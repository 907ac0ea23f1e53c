"""Demo worker app with the drain fence plugin (``celery -A celeryops.demo.worker_fenced worker``)."""

from __future__ import annotations

from celeryops.demo.tasks import create_app

app = create_app(fenced=True)
