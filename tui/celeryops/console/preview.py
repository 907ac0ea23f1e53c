"""Try the console without a fleet: ``python -m celeryops.console.preview [home|deploy|drain|watch|resume|overlap]``.
A StaticBackend with the sample data; run events play one per second."""

from __future__ import annotations

import sys

from celeryops.console import sample
from celeryops.console.app import ConsoleApp, make_app
from celeryops.console.static import StaticBackend
from celeryops.core.events import DrainFinished, FleetBack, PhaseChanged


def build(scenario: str) -> ConsoleApp:
    script = [*sample.drain_script(), sample.progress(3, 2, 600.0), sample.progress(0, 3, 630.0),
              PhaseChanged("deploying"), *sample.deploy_events("ready"), FleetBack(sample.fleet_back()),
              PhaseChanged("done", "v2.14.0 is live")]
    preflight = sample.preflight_script()
    if scenario == "overlap":  # a worker pool's new revision beside the old one, to the cutover
        old, new = sample.OLD_REV, sample.NEW_REV
        script = [*sample.overlap_script(), sample.overlap_progress(140, 2.1), sample.overlap_poll(0, 2, 600.0),
                  sample.overlap_step("old_idle", f"the workers of {old} are idle"), PhaseChanged("drained"),
                  DrainFinished("drained", 600.0, f"The old revision {old} is idle."), PhaseChanged("cutting_over"),
                  sample.overlap_step("cutting_over", f"every instance moves to {new}: 3 in all"),
                  sample.overlap_step("cut_over", f"3 instance(s) of {new} serve; {old} was retired",
                                      instances={new: 3}, split={new: 100}),
                  PhaseChanged("deployed"), FleetBack(sample.fleet_back()), PhaseChanged("done", "v2.14.0 is live")]
        preflight = sample.overlap_preflight_script()
    backend = StaticBackend(fleet=sample.fleet(), slots=sample.slots(),
                            run=sample.unfinished_run() if scenario == "resume" else None,
                            read_only=scenario == "watch", preflight_script=preflight)  # type: ignore[arg-type]
    app = make_app(backend, start="deploy" if scenario in ("deploy", "overlap") else "drain" if scenario == "drain"
                   else "home",
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
