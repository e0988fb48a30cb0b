"""Usage records: one per allocation interval, in integer milliseconds per device."""

from __future__ import annotations

from django.db import models


class UsageRecord(models.Model):
    # The deterministic key makes a replay a no-op, however late it comes.
    key = models.CharField(max_length=200, unique=True)
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.PROTECT, related_name="usage_records")
    job_id = models.BigIntegerField(db_index=True)
    device_id = models.CharField(max_length=200)
    flavor = models.CharField(max_length=63)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField()
    duration_ms = models.BigIntegerField()
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=models.Q(duration_ms__gte=0), name="usage_duration_not_negative"),
            models.CheckConstraint(
                condition=models.Q(ended_at__gte=models.F("started_at")), name="usage_ends_after_start"
            ),
        ]
        indexes = [models.Index(fields=["tenant", "started_at"])]

    def __str__(self) -> str:
        return f"{self.key}: {self.duration_ms} ms on {self.flavor}"
