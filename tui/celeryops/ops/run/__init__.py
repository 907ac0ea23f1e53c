"""One run on one fleet: the session that orchestrates it (:mod:`.session`), the operator's decisions
(:mod:`.operator`), the engine under it (:mod:`.runner`), the deploy step (:mod:`.rollout`), the recovery rules
(:mod:`.recovery`), the drain's journal hooks (:mod:`.hooks`) and the one place a run's objects are assembled
(:mod:`.wiring`)."""
