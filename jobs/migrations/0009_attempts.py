"""Attempts get rows of their own; a job's rank stats split from its balance and comm figures.

Data: each job's current attempt gets a row with the handle, launch claim, stop request and teardown
that rode on the job; each handle still waiting for a teardown becomes an earlier attempt's row (with
when it was asked to stop, from ``recovery["stopping"]``); ``recovery["previous_devices"]`` moves to
the current attempt, ``frozen_at`` to the end of the attempt before it; ``rank_stats``' ``balance`` and
``comm`` keys move to ``balance_stats`` and ``comm_stats``. Reversible.
"""

import json
from datetime import UTC, datetime

import django.db.models.deletion
from django.db import migrations, models

TERMINAL = {"succeeded", "failed", "cancelled"}


def forwards(apps, schema_editor):
    TrainingJob = apps.get_model("jobs", "TrainingJob")
    JobAttempt = apps.get_model("jobs", "JobAttempt")
    for job in TrainingJob.objects.all().iterator(chunk_size=1000):
        recovery = dict(job.recovery or {})
        stopping = recovery.pop("stopping", None) or {}
        previous_devices = recovery.pop("previous_devices", None) or []
        frozen_at = recovery.pop("frozen_at", None)
        rows = [
            JobAttempt(
                job_id=job.pk,
                number=job.attempt,
                provision_claimed_at=job.provision_claimed_at,
                backend_handle=job.backend_handle,
                stop_requested=job.stop_requested,
                torn_down_at=job.torn_down_at,
                previous_devices=previous_devices,
                ended_at=job.finished_at if job.state in TERMINAL else None,
                ended_as=job.state if job.state in TERMINAL else "",
            )
        ]
        # Handles still to tear down belong to earlier attempts (one each; which ones is not recorded,
        # so they take the numbers just below the current one: numbers are all that order attempts).
        earlier: dict[int, JobAttempt] = {}
        for offset, handle in enumerate(reversed(job.pending_teardowns or []), start=1):
            asked = stopping.get(json.dumps(handle, sort_keys=True))
            if job.attempt - offset < 0:
                # A launch that lost its race with a cancel: the current attempt's own run.
                if rows[0].backend_handle is None:
                    rows[0].backend_handle, rows[0].torn_down_at = handle, None
                continue
            earlier[job.attempt - offset] = JobAttempt(
                job_id=job.pk,
                number=job.attempt - offset,
                backend_handle=handle,
                stop_asked_at=datetime.fromtimestamp(float(asked), UTC) if asked is not None else None,
                ended_at=job.state_changed_at,
                end_reason="replaced (carried over from the job row)",
            )
        if frozen_at is not None and job.attempt > 0:
            before = earlier.setdefault(job.attempt - 1, JobAttempt(job_id=job.pk, number=job.attempt - 1))
            before.ended_at = datetime.fromtimestamp(float(frozen_at), UTC)
            before.ended_as = "recovering"
            before.end_reason = before.end_reason or "frozen (carried over from the job row)"
        rows.extend(earlier.values())
        JobAttempt.objects.bulk_create(rows)
        stats = dict(job.rank_stats or {})
        job.balance_stats = stats.pop("balance", None) or {}
        job.comm_stats = stats.pop("comm", None) or {}
        job.rank_stats = stats
        job.recovery = recovery
        job.save(update_fields=["balance_stats", "comm_stats", "rank_stats", "recovery"])


def backwards(apps, schema_editor):
    TrainingJob = apps.get_model("jobs", "TrainingJob")
    JobAttempt = apps.get_model("jobs", "JobAttempt")
    for job in TrainingJob.objects.all().iterator(chunk_size=1000):
        attempts = {a.number: a for a in JobAttempt.objects.filter(job_id=job.pk)}
        current = attempts.get(job.attempt)
        pending = [
            a
            for n, a in sorted(attempts.items())
            if n != job.attempt and a.backend_handle is not None and a.torn_down_at is None
        ]
        recovery = dict(job.recovery or {})
        stopping = {
            json.dumps(a.backend_handle, sort_keys=True): a.stop_asked_at.timestamp() for a in pending if a.stop_asked_at
        }
        if stopping:
            recovery["stopping"] = stopping
        if current is not None and current.previous_devices:
            recovery["previous_devices"] = current.previous_devices
        before = attempts.get(job.attempt - 1)
        if before is not None and before.ended_as == "recovering" and before.ended_at is not None:
            recovery["frozen_at"] = before.ended_at.timestamp()
        job.recovery = recovery
        job.pending_teardowns = [a.backend_handle for a in pending]
        if current is not None:
            job.backend_handle = current.backend_handle
            job.provision_claimed_at = current.provision_claimed_at
            job.stop_requested = current.stop_requested
            job.torn_down_at = current.torn_down_at
        job.rank_stats = {**(job.rank_stats or {}), "balance": job.balance_stats, "comm": job.comm_stats}
        job.save()


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0008_device_health"),
    ]

    operations = [
        migrations.AddField(
            model_name="trainingjob",
            name="balance_stats",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="trainingjob",
            name="comm_stats",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.CreateModel(
            name="JobAttempt",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("number", models.PositiveIntegerField()),
                ("created_at", models.DateTimeField(auto_now_add=True)),
                ("provision_claimed_at", models.DateTimeField(blank=True, null=True)),
                ("backend_handle", models.JSONField(blank=True, null=True)),
                ("stop_requested", models.CharField(blank=True, max_length=300)),
                ("stop_asked_at", models.DateTimeField(blank=True, null=True)),
                ("torn_down_at", models.DateTimeField(blank=True, null=True)),
                ("previous_devices", models.JSONField(blank=True, default=list)),
                ("ended_at", models.DateTimeField(blank=True, null=True)),
                (
                    "ended_as",
                    models.CharField(
                        blank=True,
                        choices=[
                            ("queued", "Queued"),
                            ("admitted", "Admitted"),
                            ("running", "Running"),
                            ("recovering", "Recovering"),
                            ("succeeded", "Succeeded"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                        ],
                        max_length=16,
                    ),
                ),
                ("end_reason", models.CharField(blank=True, max_length=500)),
                (
                    "job",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT, related_name="attempts", to="jobs.trainingjob"
                    ),
                ),
            ],
            options={
                "constraints": [models.UniqueConstraint(fields=("job", "number"), name="attempt_one_per_number")],
            },
        ),
        migrations.RunPython(forwards, backwards),
        migrations.RemoveField(model_name="trainingjob", name="backend_handle"),
        migrations.RemoveField(model_name="trainingjob", name="pending_teardowns"),
        migrations.RemoveField(model_name="trainingjob", name="provision_claimed_at"),
        migrations.RemoveField(model_name="trainingjob", name="stop_requested"),
        migrations.RemoveField(model_name="trainingjob", name="torn_down_at"),
    ]
