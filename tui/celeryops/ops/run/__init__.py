"""One run on one fleet: the session that orchestrates it (:mod:`.session`), the public run context every strategy and
flow runs in (:mod:`.context`, with the write-ahead helper of :mod:`.writeahead`), the strategies and their registry
(:mod:`.strategies`), a worker pool's public steps (:mod:`.pool`), the canary's analysis (:mod:`.analysis`), the
operator's answers and decisions (:mod:`.operator`, :mod:`.decisions`), the engine under it (:mod:`.runner`), the
deploy step (:mod:`.rollout`), a rollback's plan and routes (:mod:`.rollback_plan`, :mod:`.routing`,
:mod:`.rollback`), the recovery rules (:mod:`.recovery`), the drain's journal hooks (:mod:`.hooks`) and the one place
a run's objects are assembled (:mod:`.wiring`)."""
