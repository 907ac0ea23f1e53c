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


def stop_plan(model: RunModel) -> str:
    """What G starts on a run that stops consumers (a drain, a deploy, a rollback that is no overlap)."""
    if model.kind == "rollback":
        return ("Consumers are cancelled on every worker (running and prefetched tasks finish), the fleet is "
                "drained, then each target is routed back to its earlier revision (no new image, no new "
                "revision). A timeout restores consumers and changes nothing.")
    deploy = f" then deploy {model.release}" if model.kind == "deploy" else ""
    return ("Consumers are cancelled on every worker (running and prefetched tasks finish), the fleet is "
            f"drained{deploy}. A timeout restores consumers and deploys nothing.")


def overlap_plan(model: RunModel) -> str:
    """What G starts on an overlap deploy: the peak (the ``traffic`` check's finding names it), then the steps."""
    traffic = model.checks.get("traffic")
    peak = f"Instances: {traffic.detail}.\n" if traffic is not None and traffic.status == "ok" else ""
    release = f" {model.release}" if model.release else ""
    if model.strategy == "canary":
        return (f"{peak}A canary of{release} comes up beside the old revision (no old instance is taken away) and "
                "consumes; every task's outcome is credited to the revision that ran it and judged every look. "
                "If the canary fails more often than the old revision beyond chance, raises a new exception "
                "repeatedly or crashes, its workers stop taking tasks at once, finish what they run, and the pool "
                "goes back to the old revision. Once enough canary tasks show no worse failure rate, it is "
                "promoted as an overlap: the old revision drains while the new one consumes, then every instance "
                "moves to it. No verdict by max duration: it pauses for you (P promotes, B rolls back).")
    if model.kind == "rollback":  # the "new" revision is the previous one, routed back to
        return (f"{peak}The previous revision{release} comes up beside the current one (no instance is taken "
                "away) and starts consuming. Only then do the current revision's workers stop taking new "
                "tasks: their running and prefetched tasks finish while the previous revision consumes, so "
                "processing never pauses. Once they are idle, every instance moves back to the previous "
                "revision at the original count. Nothing is killed: if the current revision is not idle "
                "within max wait, it consumes again and the previous one is retired.")
    return (f"{peak}The new revision of{release} comes up beside the old one (no old instance is taken away) "
            "and starts consuming. Only then do the old revision's workers stop taking new tasks: their running "
            "and prefetched tasks finish while the new revision consumes, so processing never pauses. Once the "
            "old revision is idle (the drain's empty streak), every instance moves to the new revision, back "
            "to the original count. Nothing is killed: if the old revision is not idle within max wait, or the "
            "new one does not consume, the old revision consumes again and the new one is retired.")


def starts_overlap(model: RunModel) -> bool:
    """G starts an overlap (a deploy or rollback of a worker pool whose strategy is overlap), not a drain."""
    return model.is_overlap and model.kind != "drain"


def proceed_question(model: RunModel) -> Question:
    """G in the preflight: the warnings to accept first, if any, then what starts."""
    warned = model.warned_checks
    overlap = starts_overlap(model)
    plan = overlap_plan(model) if overlap else stop_plan(model)
    flow = "canary" if model.strategy == "canary" else "overlap"
    if warned:
        listing = "\n".join(f"▲ {c.title}: {c.detail}" for c in warned)
        return (f"Proceed despite {len(warned)} warning(s)?", f"{listing}\n\n{plan}",
                f"Accept warnings and start the {flow}" if overlap else "Accept warnings and stop consumers")
    if overlap:
        return f"Start the {flow} {_overlap_word(model)}?", plan, f"Start the {flow}"
    return "Stop consumers and drain?", plan, "Stop consumers"


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
            "on a worker pool whose strategy is overlap, the previous revision comes up beside the current "
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
