"""One scenario for ``controlplane.bulk``, run on PostgreSQL by tests/integration/test_bulk.py and, in a
process of its own, on SQLite (the embedded default): both must give the same answers.

``python -m tests.bulk_scenario`` migrates the database that the environment names and prints the
scenario's answers as JSON."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

WHEN = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
# A reason with what quoting gets wrong: quotes and a backslash.
REASON = '6 of 8 in use; it\'s "quoted", and has a \\ backslash'


def run() -> dict[str, Any]:
    """Write in bulk what a cycle writes (reasons where they changed, claims' fields, events) and read it back."""
    from django.db.models import F

    from controlplane import bulk
    from jobs.models import JobEvent, JobState, TrainingJob
    from tenants.models import Tenant

    tenant = Tenant.objects.create(slug="bulk-scenario", name="bulk scenario")
    jobs = [
        TrainingJob.objects.create(tenant=tenant, name=f"j{n}", spec={}, pending_reason="old", state=state)
        for n, state in enumerate([JobState.QUEUED, JobState.QUEUED, JobState.QUEUED, JobState.CANCELLED])
    ]
    ids = [job.pk for job in jobs]
    answers: dict[str, Any] = {}
    # Reasons: the second keeps its own, the fourth is no longer queued; only the first and third change.
    answers["reasons_changed"] = bulk.update_rows(
        TrainingJob,
        ["pending_reason"],
        {ids[0]: (REASON,), ids[1]: ("old",), ids[2]: ("",), ids[3]: ("x",)},
        where={"state": JobState.QUEUED},
        only_changed=True,
    )
    # A claim's fields, a value per row: JSON, a flag, a time, and an empty one.
    answers["claimed"] = bulk.update_rows(
        TrainingJob,
        ["demand", "borrowing", "admitted_at"],
        {ids[0]: ({"nau": 1500, "a100-sxm": 2}, True, WHEN), ids[1]: ({}, False, None)},
    )
    # A value not of the field's own type goes through the field's conversion, as the ORM's writes do.
    bulk.update_rows(TrainingJob, ["name"], {ids[3]: (5,)})
    answers["converted_name"] = TrainingJob.objects.get(pk=ids[3]).name
    answers["jobs"] = [
        [row[0], row[1], row[2], row[3], None if row[4] is None else row[4].isoformat()]
        for row in TrainingJob.objects.filter(pk__in=ids)
        .order_by("pk")
        .values_list("pending_reason", "demand", "borrowing", "state", "admitted_at")
    ]
    kind = JobEvent.Kind.TRANSITION
    answers["events_inserted"] = bulk.insert_rows(
        JobEvent,
        ["job", "tenant", "kind", "from_state", "to_state", "message", "data", "created_at"],
        [
            # A foreign key takes the related row as well as its key.
            (
                ids[n],
                tenant if n else tenant.pk,
                kind,
                "queued",
                "admitted",
                f"admitted {n}",
                {"devices": [f"d/{n}"]},
                WHEN,
            )
            for n in range(2)
        ],
    )
    answers["events"] = [
        [ids.index(row[0]), row[1], row[2], row[3], row[4].isoformat()]
        for row in JobEvent.objects.filter(job_id__in=ids)
        .order_by("pk")
        .values_list("job_id", "to_state", "message", "data", "created_at")
    ]
    answers["nothing_to_write"] = [
        bulk.update_rows(TrainingJob, ["pending_reason"], {}),
        bulk.update_rows(TrainingJob, [], {ids[0]: ()}),
        bulk.insert_rows(JobEvent, ["job"], []),
    ]
    refused = []
    for bad in (
        lambda: bulk.update_rows(TrainingJob, ["steps_done"], {ids[0]: (F("steps_done") + 1,)}),
        lambda: bulk.update_rows(TrainingJob, ["pending_reason", "borrowing"], {ids[0]: ("one value",)}),
        lambda: bulk.insert_rows(TrainingJob, ["events"], [(1,)]),
    ):
        try:
            bad()
        except (TypeError, ValueError) as exc:
            refused.append(f"{type(exc).__name__}: {exc}")
    answers["refused"] = refused
    return answers


if __name__ == "__main__":
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction

    call_command("migrate", verbosity=0)
    with transaction.atomic():
        print(json.dumps(run()))
