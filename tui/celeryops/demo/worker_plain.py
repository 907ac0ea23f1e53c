"""Demo worker app without the fence plugin: the drain stops it by re-broadcasting ``cancel_consumer``."""

from __future__ import annotations

from celeryops.demo.tasks import create_app

app = create_app(fenced=False)
