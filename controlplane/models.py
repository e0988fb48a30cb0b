"""What the Celery workers tell the metrics endpoint: task counts and runtimes, and which workers live.

Workers are separate processes (and on Kubernetes separate pods), and the web process that answers
``/metrics`` sees none of their memory. Each worker process therefore adds up its own counts in memory
and folds them into these rows every few seconds (``controlplane.taskstats``); the scrape reads the rows.
A worker killed between two flushes loses at most those seconds of counts, which Prometheus reads as
a slower rate, never as a counter going back.
"""

from __future__ import annotations

from django.db import models


class TaskCounter(models.Model):
    """Every run of one Celery task, by how it ended, and its runtimes as a cumulative histogram."""

    task = models.CharField(max_length=200, unique=True)
    succeeded = models.BigIntegerField(default=0)
    failed = models.BigIntegerField(default=0)
    retried = models.BigIntegerField(default=0)
    runtime_sum_s = models.FloatField(default=0.0)
    # Counts of runs at or under each of controlplane.taskstats.RUNTIME_BUCKETS, then the total (+Inf).
    runtime_buckets = models.JSONField(default=list)

    def __str__(self) -> str:
        return self.task


class WorkerBeat(models.Model):
    """When a worker (by Celery's node name) last flushed its counts: the live workers are the recent ones."""

    hostname = models.CharField(max_length=200, unique=True)
    seen_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.hostname} at {self.seen_at:%H:%M:%S}"
