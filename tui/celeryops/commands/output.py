"""Headless output: one JSON object per line (``--json``) or readable lines. No Textual."""

from __future__ import annotations

import json
import sys
import threading
from typing import Any, TextIO

from celeryops.adapters.deploy.base import RolloutEvent
from celeryops.core import events
from celeryops.core.errors import UserError
from celeryops.core.masking import mask_text
from celeryops.core.wording import check_line, duration, say

FINAL_EVENTS = ("timeout", "interrupted", "error", "deployed", "preflight_failed", "declined", "deploy_failed",
                "rolled_back", "rollback_failed", "canary_rolled_back", "canary_paused", "autoscale_stopped")


class Printer:
    """Prints ops events to a stream. JSON mode: ``{"event": ...}`` per line, flushed at once (scripts tail it)."""

    def __init__(self, as_json: bool, stream: TextIO | None = None) -> None:
        self.as_json = as_json
        self.stream = stream or sys.stdout
        self.finished = False  # a final event (drained/timeout/interrupted/error) was printed
        self._warned: tuple[str, ...] = ()  # text mode repeats a warning only when it changes
        # Held while a line is written (threads such as the demo's autoscaler print too); hold it to check
        # ``finished`` and print in one step.
        self.lock = threading.RLock()

    def __call__(self, event: events.Event) -> None:
        with self.lock:
            self._print(event)

    def _print(self, event: events.Event) -> None:
        if ((isinstance(event, events.DrainFinished) and event.outcome != "drained")
                or isinstance(event, events.RunFinished)):
            self.finished = True
        if self.as_json:
            self.json(event.to_json())
        elif isinstance(event, events.RunFinished) and event.outcome == "preflight_failed":
            # nothing was touched: the one sentence of a user error, where scripts and people look for it
            sys.stderr.write(mask_text(f"celeryops: {event.message}") + "\n")
            sys.stderr.flush()
        else:
            line = self.text(event)
            if line:
                self.stream.write(mask_text(line) + "\n")
                self.stream.flush()

    def json(self, data: dict[str, Any]) -> None:
        with self.lock:
            if data.get("event") in FINAL_EVENTS:
                self.finished = True
            self.stream.write(mask_text(json.dumps(data, default=str, sort_keys=False)) + "\n")
            self.stream.flush()

    def error(self, err: UserError) -> None:
        """End the ``--json`` stream with an ``error`` event (the command fails with ``err``), unless a final event
        ended it already."""
        with self.lock:
            if self.as_json and not self.finished:
                self.json({"event": "error", "message": str(err), "exit_code": err.exit_code})

    def text(self, event: events.Event) -> str:
        """The event's line(s) in text mode: the one wording (:mod:`celeryops.core.wording`), with what plain text
        adds to it (a line per poll, marks and remedies under the checks, the fleet after a deploy)."""
        if isinstance(event, events.DrainProgress):
            return self._poll(event)
        if isinstance(event, events.CheckUpdate):
            if event.status in ("running", "pending"):
                return ""
            mark = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL"}.get(event.status, event.status)
            line = f"  [{mark}] {check_line(event)}" + (" (accepted)" if event.accepted else "")
            return line + (f"\n         -> {event.remedy}" if event.remedy and event.status != "ok" else "")
        if isinstance(event, RolloutEvent):
            return f"  {event.text}"
        if isinstance(event, events.FleetBack):
            return "\n".join(f"  {w}: {', '.join(q)}" for w, q in sorted(event.workers.items()))
        if isinstance(event, events.PhaseChanged | events.PreflightDone | events.RunFollowed):
            return ""  # the lines around them already say it
        said = say(event)
        if said is None:
            return ""
        level, text = said
        if isinstance(event, events.StageStarted):
            return f"== {text}"
        if isinstance(event, events.TargetDeployed):  # where the result is: revision, service URL, console page, logs
            line = f"  {event.target}: revision {event.revision or '-'}" + (f"  {event.url}" if event.url else "")
            if isinstance(event, events.TargetRolledBack):
                was = f" (was {event.previous_revision})" if event.previous_revision else ""
                line = f"  {event.target}: revision {event.revision} serves now{was}" + (
                    f"  {event.url}" if event.url else "")
            line += f"\n    console: {event.console_url}" if event.console_url else ""
            return line + (f"\n    logs: {event.logs_url}" if event.logs_url else "")
        if isinstance(event, events.Notice) and level != "info":
            return f"{level}: {text}"
        if isinstance(event, events.RunFinished) and event.logs_url:
            return f"{text}\nLogs URL: {event.logs_url}"
        return text

    def _poll(self, event: events.DrainProgress) -> str:
        silent = [f"{n} ({duration(event.silent[n])}{', busy' if n in event.alive else ''})"
                  for n in event.unknown if n in event.silent]
        other = [n for n in event.unknown if n not in event.silent]
        unknown = (f"  silent: {', '.join(silent)}" if silent else "") + (
            f"  unknown: {', '.join(other)}" if other else "")
        held = {q: n for q, n in event.consumers.items() if n}
        if held:
            unknown += "  consumers: " + ", ".join(f"{q} {n if n >= 0 else '?'}" for q, n in sorted(held.items()))
        line = (f"[{duration(event.elapsed)}] streak {event.streak}/{event.required}  active {event.active}  "
                f"reserved {event.reserved}  scheduled {event.scheduled}  left {duration(event.remaining)}"
                f"{unknown}")
        if event.warnings != self._warned:
            for warning in event.warnings:
                line += f"\n  warning: {warning}"
            self._warned = event.warnings
        return line
