"""``celeryops autoscale``: a Cloud Run worker pool sized by what Celery holds, scaled in without killing a task.

- :mod:`.policy`: the decision, pure (demand, capacity, cohorts -> out / in / hold, with its reason);
- :mod:`.demand`: one look at the pool (the broker's ready counts, the workers' reserved and active tasks, the
  cohorts from Cloud Run and the fence registry);
- :mod:`.loop`: the control loop (:func:`~celeryops.ops.autoscale.loop.autoscale`), the one entry point of the
  command, the demo and the benches.

The steps that change the pool (a cohort added, a cohort drained and taken away), each a run written ahead in the
journal under the fleet's lease, and their recovery are :mod:`celeryops.ops.run.scaling`'s.
"""
