"""The demo sandbox behind ``celeryops demo``: the whole product on loopback, torn down on exit.

:class:`~celeryops.demo.sandbox.Sandbox` starts a private Redis (``redis-server``, else the fakeredis fallback),
real Celery workers running the demo tasks (:mod:`celeryops.demo.tasks`), a producer and an autoscaler, the Cloud Run
and registry stand-ins, and a git repository with the release branch; :class:`~celeryops.demo.timing.Timing`
scales every duration by ``--speed``.
"""
