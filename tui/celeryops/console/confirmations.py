"""What the console asks before each dangerous decision: the title, what will happen, and the button's label.

Each function reads the run model (or the record the operator picked) and returns a :data:`Question`; the app
shows it in a confirmation dialog and acts only on yes. Nothing here touches Textual or the backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celeryops.console.model import RunModel
    from celeryops.ops.backend.views import RunRecordView, StrandedWorker

#: (title, what happens, the confirming button's label)
Question = tuple[str, str, str]


def proceed_question(model: RunModel) -> Question:
    """G in the preflight: the warnings to accept first, if any, then what starts (the run's strategy says it)."""
    said = model.said
    traffic = model.checks.get("traffic")
    peak = f"Instances: {traffic.detail}.\n" if traffic is not None and traffic.status == "ok" else ""
    plan = said.plan.replace("{peak}", peak)
    warned = model.warned_checks
    if warned:
        listing = "\n".join(f"▲ {c.title}: {c.detail}" for c in warned)
        return f"Proceed despite {len(warned)} warning(s)?", f"{listing}\n\n{plan}", said.warned_button
    return said.question, plan, said.button


def abort_question(model: RunModel) -> Question:
    """A on a run: what the abort does at this point of the run."""
    overlap = model.overlap
    if overlap is not None and model.phase in ("cutting_over", "deployed"):
        return (f"Abort the overlap {_overlap_word(model)}?",
                f"The cutover has begun: the old revision {overlap.old} is idle and its instances are "
                f"being taken away, so the abort finishes it and {overlap.new} serves every instance. "
                "Nothing is killed.", "Abort (finish the cutover)")
    if overlap is not None:
        return (f"Abort the overlap {_overlap_word(model)}?",
                f"The workers of the old revision {overlap.old} consume again first; then the workers of "
                f"{overlap.new} stop taking tasks and finish what they run, and every instance goes back "
                f"to {overlap.old} at the original count. Nothing is killed; if {overlap.new} stays busy "
                "past max wait, both revisions keep consuming and the run stays open.",
                "Abort and retire the new revision")
    return ("Abort the run?", "Consumers are added back exactly as they were before the drain and the "
            "run is marked aborted; nothing is deployed. Tasks already running keep running.", "Abort and restore")


def quit_abort_label(model: RunModel) -> str:
    """The quit question's abort button during a run."""
    if model.overlap is None:
        return "Abort and restore consumers"
    return ("Abort: finish the cutover" if model.phase in ("cutting_over", "deployed") else
            "Abort: the old revision consumes again, the new one is retired")


def rollback_question(run: RunRecordView) -> Question:
    """B in the run history: undo that deploy. The preflight comes first; nothing changes until G."""
    release = f" (release {run.release})" if run.release else ""
    return (f"Roll back run {run.run_id}?",
            f"Each target of run {run.run_id}{release} goes back to the revision that deploy replaced: "
            "no new image, no new revision. The preflight checklist runs first and names the revisions; "
            "nothing changes until you press G there, then, as for a deploy, the fleet is drained (or, "
            "on a worker pool deployed without a pause, the previous revision comes up beside the current "
            "one first) and the targets are routed back.", "Start the rollback's preflight")


def restore_again_question(stranded: tuple[StrandedWorker, ...]) -> Question:
    """X on the home view: the last run's restore again, for workers a broker reconnect left consuming nothing."""
    names = ", ".join(f"{s.name} ({', '.join(s.queues)})" for s in stranded)
    runs = ", ".join(sorted({s.run_id for s in stranded}))
    return ("Restore again?", f"{names} consume nothing since the restore of run {runs}: a broker reconnect "
            "made Celery forget the restored queues. The restore is sent again to them and checked (what "
            "`celeryops abort` does). A worker that drops back at the next reconnect needs a restart; "
            "celeryops.fence in the worker app puts the queues back by itself.", "Restore again")


def _overlap_word(model: RunModel) -> str:
    return "rollback" if model.kind == "rollback" else "deploy"
