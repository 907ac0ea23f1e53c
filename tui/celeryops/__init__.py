"""celeryops: drain, deploy and recover Celery fleets safely."""

__version__ = "0.1.0"
