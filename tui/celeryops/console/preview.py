"""Try the console without a fleet: ``python -m celeryops.console.preview [home|deploy|drain|watch|resume]``.
A StaticBackend with the sample data; run events play one per second."""

from __future__ import annotations

import sys

from celeryops.console import sample
from celeryops.console.app import ConsoleApp, make_app
from celeryops.console.static import StaticBackend
from celeryops.core.events import FleetBack, PhaseChanged


def build(scenario: str) -> ConsoleApp:
    script = [*sample.drain_script(), sample.progress(3, 2, 600.0), sample.progress(0, 3, 630.0),
              PhaseChanged("deploying"), *sample.deploy_events("ready"), FleetBack(sample.fleet_back()),
              PhaseChanged("done", "v2.14.0 is live")]
    backend = StaticBackend(fleet=sample.fleet(), slots=sample.slots(),
                            run=sample.unfinished_run() if scenario == "resume" else None,
                            read_only=scenario == "watch", preflight_script=sample.preflight_script())  # type: ignore[arg-type]
    app = make_app(backend, start="deploy" if scenario == "deploy" else "drain" if scenario == "drain" else "home",
                   release="v2.14.0", clock=lambda: sample.NOW)

    def play_later() -> None:
        events = list(script)

        def step() -> None:
            if events:
                backend.emit(events.pop(0))  # type: ignore[arg-type]
        app.set_interval(1.0, step)

    backend.proceed_script = ()
    original = backend.proceed

    async def proceed() -> None:
        await original()
        play_later()
    backend.proceed = proceed  # type: ignore[method-assign]
    if scenario == "watch":
        backend.follow_script = script  # type: ignore[assignment]
    return app


if __name__ == "__main__":
    sys.exit(build(sys.argv[1] if len(sys.argv) > 1 else "home").run() or 0)
