"""Writes of thousands of rows in one statement (``controlplane.bulk``): the same answers on PostgreSQL,
where every column travels as one array bound in binary, and on SQLite, the embedded default."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import DataError, connection, transaction
from django.test.utils import CaptureQueriesContext

from controlplane import bulk
from jobs.models import JobState, TrainingJob
from tests import bulk_scenario

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parents[2]
REASON = bulk_scenario.REASON
WHEN = bulk_scenario.WHEN.isoformat()


def _expected() -> dict:
    return {
        "reasons_changed": 2,
        "claimed": 2,
        "jobs": [
            [REASON, {"nau": 1500, "a100-sxm": 2}, True, JobState.QUEUED, WHEN],
            ["old", {}, False, JobState.QUEUED, None],
            ["", {}, False, JobState.QUEUED, None],
            ["old", {}, False, JobState.CANCELLED, None],
        ],
        "converted_name": "5",
        "events_inserted": 2,
        "events": [
            [0, "admitted", "admitted 0", {"devices": ["d/0"]}, WHEN],
            [1, "admitted", "admitted 1", {"devices": ["d/1"]}, WHEN],
        ],
        "nothing_to_write": [0, 0, 0],
        "refused": [
            "TypeError: steps_done: an expression cannot be written in bulk, only a value",
            "ValueError: a row has 2 values for 3 fields",
            "ValueError: TrainingJob.events is not a column",
        ],
    }


def test_rows_written_in_bulk_on_postgresql_read_back_as_written():
    assert bulk_scenario.run() == _expected()


def test_the_embedded_default_sqlite_gives_the_same_answers(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "CELERY_", "CHANNEL_"))}
    env.update(POLYCHIP_VAR_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="controlplane.settings")
    done = subprocess.run(
        [sys.executable, "-m", "tests.bulk_scenario"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "polychip.sqlite3").exists()
    assert json.loads(done.stdout.strip().splitlines()[-1]) == _expected()


def test_a_bulk_statement_runs_in_the_callers_transaction_and_is_logged_as_any_query(tenants):
    job = TrainingJob.objects.create(tenant_id=tenants[0].id, name="t", spec={}, pending_reason="before")
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        assert bulk.update_rows(TrainingJob, ["pending_reason"], {job.pk: ("inside",)}) == 1
        assert TrainingJob.objects.get(pk=job.pk).pending_reason == "inside"
        transaction.set_rollback(True)
    assert TrainingJob.objects.get(pk=job.pk).pending_reason == "before"
    assert any("unnest" in query["sql"] for query in queries.captured_queries)


def test_a_string_longer_than_its_column_is_refused_not_cut(tenants):
    job = TrainingJob.objects.create(tenant_id=tenants[0].id, name="t", spec={}, pending_reason="before")
    with pytest.raises(DataError, match="too long"), transaction.atomic():
        bulk.update_rows(TrainingJob, ["pending_reason"], {job.pk: ("x" * 501,)})
    assert TrainingJob.objects.get(pk=job.pk).pending_reason == "before"


def test_the_array_cursor_is_for_postgresql_only(monkeypatch):
    monkeypatch.setattr(connection, "vendor", "sqlite")
    with pytest.raises(RuntimeError, match="needs PostgreSQL, not sqlite"), bulk.array_cursor():
        pass


def test_the_jobs_table_leaves_room_on_each_page_for_a_rows_next_version():
    # A waiting job's new reason is then a heap-only update: none of the table's indexes is touched.
    with connection.cursor() as cursor:
        cursor.execute("SELECT reloptions FROM pg_class WHERE relname = %s", [TrainingJob._meta.db_table])
        (options,) = cursor.fetchone()
    assert "fillfactor=40" in options


def test_the_jobs_table_has_no_index_that_another_covers():
    # Each index costs each new version of a job's row an entry; state and tenant lead composite ones.
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexdef FROM pg_indexes WHERE tablename = %s", [TrainingJob._meta.db_table])
        columns = sorted(definition.split(" USING btree ")[1] for (definition,) in cursor.fetchall())
    assert columns == [
        "(id)",
        "(state, created_at)",
        "(submitted_by_id)",
        "(tenant_id, id DESC)",
        "(tenant_id, state, priority DESC, created_at)",
    ]
