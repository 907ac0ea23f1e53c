"""The autoscaler's events, in the one event vocabulary (:mod:`celeryops.core.events`): a look and its decision, a
step that changes the pool, the end. Pure data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from celeryops.core.events import Event

ScaleStepName = Literal["adding", "added", "draining", "drained", "removing", "removed", "restored", "given_up",
                        "waiting", "recovered"]


@dataclass(frozen=True)
class AutoscaleLook(Event):
    """One look of ``celeryops autoscale`` at worker pool ``target`` (``--json`` event ``autoscale``): the decision
    (``action`` out / in / hold / wait, ``reason`` one sentence), the instances the demand needs (``desired``) and
    those the pool runs (``instances``), the demand (tasks waiting or running) against the capacity (``instances``
    x ``per_instance``), ETA tasks apart (``scheduled``), per queue (``queues``: ready, reserved, active,
    scheduled) and the cohorts (revision, count, live, busy, state). ``dry_run``: nothing is changed."""

    target: str
    action: str
    reason: str
    desired: int
    instances: int
    demand: int
    capacity: int
    per_instance: int
    scheduled: int = 0
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    cohorts: tuple[dict[str, Any], ...] = ()
    dry_run: bool = False
    kind: str = field(init=False, default="autoscale")


@dataclass(frozen=True)
class AutoscaleStep(Event):
    """A step of the autoscaler on worker pool ``target`` (``--json`` event ``autoscale_step``), each a run written
    ahead in the journal (``run_id``): ``adding`` / ``added`` (a cohort of ``count`` instances, revision
    ``revision``), ``draining`` / ``drained`` (an idle cohort's workers stop taking tasks and are confirmed idle),
    ``removing`` / ``removed`` (its instances taken away, ``count`` of them kept), ``restored`` (its workers consume
    again), ``given_up`` (it got busy: nothing removed), ``waiting`` (another run holds the fleet),
    ``recovered`` (an interrupted step finished or undone). ``message``: one sentence."""

    step: ScaleStepName
    target: str
    revision: str = ""
    count: int = 0
    run_id: str = ""
    message: str = ""
    kind: str = field(init=False, default="autoscale_step")


@dataclass(frozen=True)
class AutoscaleStopped(Event):
    """The autoscaler ended (``--json`` event ``autoscale_stopped``): why, in one sentence, and its exit code (0:
    stopped by a signal with every worker consuming)."""

    target: str
    message: str
    exit_code: int = 0
    kind: str = field(init=False, default="autoscale_stopped")


__all__ = ["AutoscaleLook", "AutoscaleStep", "AutoscaleStopped", "ScaleStepName"]
