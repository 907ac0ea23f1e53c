"""A Cloud Run worker pool's revisions, moved by public steps any flow calls (a strategy or not):

- :mod:`.pool`: :class:`~.pool.Pool`, the pool in one run (the run context, the target, the run id, its words): what
  every step takes, and how it reads and updates the pool, the fence registry's workers by revision, the run's phases;
- :mod:`.steps`: the steps by revision (:func:`~.steps.scale_to` exact counts per revision,
  :func:`~.steps.wait_consuming`, :func:`~.steps.drain_revision` and :func:`~.steps.release`, :func:`~.steps.hold`,
  :func:`~.steps.take_away`) and those of two revisions, from ``old`` to ``new`` (:func:`~.steps.scale_up`,
  :func:`~.steps.wait_new`, :func:`~.steps.drain_old`, :func:`~.steps.promote`);
- :mod:`.switch`: every instance from one revision to another without a pause (:func:`~.switch.hand_over`,
  :func:`~.switch.cut_over`, :func:`~.switch.retire_new`, and :func:`~.switch.move`, a whole run of it);
- :mod:`.recover`: around the steps (:func:`~.recover.guarded`, :func:`~.recover.taken_over`) and the pool's recovery
  rules up to a flow's own part (:func:`~.recover.recovery_step`);
- :mod:`.rules`: the plans and the recovery rules, pure; :mod:`.checks`: the preflight; :mod:`.progress`: the
  ``progress`` steps while two revisions run.

Every pool update and every stop is written ahead in the run journal (``RunContext.written_ahead``).
"""
