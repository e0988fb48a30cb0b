"""A job's metrics history: rank 0's loss and named scalars, stored per step through the real ingest
endpoint, and read back over the API downsampled in SQL (checked against Python over the same rows)."""

from __future__ import annotations

import math
import random
import time
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from jobs import services
from jobs.models import JobState, MetricPoint, TrainingJob
from runtime.jobspec import parse_job_spec

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SPEC = {"name": "metrics", "devices": 2, "flavors": ["tpu-v4"], "workload": {"steps": 50}}


def running_job(tenant_id: int) -> TrainingJob:
    view = services.submit_job(tenant_id=tenant_id, user_id=None, spec=parse_job_spec(SPEC))
    TrainingJob.objects.filter(pk=view.id).update(state=JobState.RUNNING)
    return TrainingJob.objects.get(pk=view.id)


def step(rank: int, number: int, loss: float, **extra: Any) -> dict[str, Any]:
    return {"kind": "step", "rank": rank, "ts": time.time(), "step": number, "total_steps": 50, "loss": loss, **extra}


def post(job: TrainingJob, events: list[dict[str, Any]]):
    return Client().post(
        f"/api/v1/ingest/jobs/{job.pk}/telemetry",
        {"events": events},
        content_type="application/json",
        headers={"Authorization": f"Bearer {services.ingest_token(job)}"},
    )


def api(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def series_of(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in body["series"]}


def test_rank_zeros_loss_and_metrics_are_stored_per_step(tenants, pool):
    job = running_job(tenants[0].id)
    events = [
        step(0, 1, 2.5, metrics={"lr": 0.1, "grad/norm": 4.0}),
        step(1, 1, 9.9, metrics={"lr": 7.0, "rank1.only": 1.0}),  # rank 1 does not speak for the job
        step(0, 2, 2.0, metrics={"lr": 0.05, "grad/norm": 3}),
        {"kind": "metrics", "rank": 0, "ts": time.time(), "step": 2, "metrics": {"eval:accuracy": 0.5}},
        {"kind": "metrics", "rank": 1, "ts": time.time(), "step": 2, "metrics": {"eval:accuracy": 0.1}},
    ]
    assert post(job, events).json() == {"applied": 5}

    stored = {(p.name, p.step): (p.value, p.attempt) for p in MetricPoint.objects.filter(job=job)}
    assert stored == {
        ("loss", 1): (2.5, 0),
        ("loss", 2): (2.0, 0),
        ("lr", 1): (0.1, 0),
        ("lr", 2): (0.05, 0),
        ("grad/norm", 1): (4.0, 0),
        ("grad/norm", 2): (3.0, 0),
        ("eval:accuracy", 2): (0.5, 0),
    }

    body = api(tenants[0].token).get(f"/api/v1/jobs/{job.pk}/metrics").json()
    assert body["job"] == job.pk
    assert [s["name"] for s in body["series"]] == ["eval:accuracy", "grad/norm", "loss", "lr"]
    loss = series_of(body)["loss"]
    assert loss == {
        "name": "loss",
        "points": [
            {"step": 1, "value": 2.5, "min": 2.5, "max": 2.5, "last": 2.5},
            {"step": 2, "value": 2.0, "min": 2.0, "max": 2.0, "last": 2.0},
        ],
        "downsampled": False,
        "total_points": 2,
    }
    # Names comma-separated and repeated; one the job never reported is an empty series.
    body = api(tenants[0].token).get(f"/api/v1/jobs/{job.pk}/metrics?name=lr,loss&name=nothing.yet").json()
    assert [(s["name"], s["total_points"]) for s in body["series"]] == [("lr", 2), ("loss", 2), ("nothing.yet", 0)]


def test_a_step_trained_again_after_a_restore_overwrites_its_point(tenants, pool):
    job = running_job(tenants[0].id)
    assert post(job, [step(0, n, 3.0 - n / 10, metrics={"acc": n / 10}) for n in range(1, 6)]).status_code == 200

    # The next attempt restores step 3 and trains steps 4 and 5 again (its own ingest token).
    TrainingJob.objects.filter(pk=job.pk).update(attempt=1)
    job.refresh_from_db()
    # One batch may report a step twice (a retried send): the later report is kept.
    redo = [step(0, 4, 1.11, metrics={"acc": 0.44}), step(0, 5, 9.0), step(0, 5, 1.22, metrics={"acc": 0.55})]
    assert post(job, redo).status_code == 200

    points = {(p.name, p.step): (p.value, p.attempt) for p in MetricPoint.objects.filter(job=job)}
    assert points[("loss", 3)] == (pytest.approx(2.7), 0)
    assert points[("loss", 4)] == (1.11, 1)
    assert points[("loss", 5)] == (1.22, 1)
    assert points[("acc", 5)] == (0.55, 1)
    assert MetricPoint.objects.filter(job=job).count() == 10  # overwritten, not duplicated


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({**step(0, 1, 2.0), "metrics": [1, 2]}, "events[0].metrics"),
        ({**step(0, 1, 2.0), "metrics": {"bad name": 1.0}}, "events[0].metrics"),
        ({**step(0, 1, 2.0), "metrics": {"x" * 65: 1.0}}, "events[0].metrics"),
        ({**step(0, 1, 2.0), "metrics": {f"m{i}": 1.0 for i in range(33)}}, "events[0].metrics"),
        ({**step(0, 1, 2.0), "metrics": {"acc": "high"}}, "events[0].metrics.acc"),
        ({**step(0, 1, 2.0), "metrics": {"acc": True}}, "events[0].metrics.acc"),
        ({**step(0, 1, 2.0), "metrics": {"ppl": 1e101}}, "events[0].metrics.ppl"),
        ({"kind": "metrics", "rank": 0, "ts": 1.0, "metrics": {"acc": 1.0}}, "events[0].step"),
        ({"kind": "metrics", "rank": 0, "ts": 1.0, "step": 3}, "events[0].metrics"),
    ],
)
def test_bad_metrics_are_refused_naming_the_field_and_store_nothing(tenants, pool, event, field):
    job = running_job(tenants[0].id)
    response = post(job, [step(0, 1, 2.0), event])
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field.replace("events[0]", "events[1]")
    assert not MetricPoint.objects.filter(job=job).exists()


def expected_buckets(rows: list[tuple[int, float]], points: int) -> list[dict[str, Any]]:
    """The documented downsampling, in Python: equal step widths over the steps present."""
    first, last = rows[0][0], rows[-1][0]
    width = math.ceil((last - first + 1) / points)
    buckets: dict[int, list[tuple[int, float]]] = {}
    for s, v in rows:
        buckets.setdefault((s - first) // width, []).append((s, v))
    out = []
    for key in sorted(buckets):
        members = buckets[key]
        values = [v for _, v in members]
        out.append(
            {
                "step": members[0][0],
                "value": sum(values) / len(values),
                "min": min(values),
                "max": max(values),
                "last": members[-1][1],
            }
        )
    return out


def assert_points_match(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g["step"] == w["step"]
        assert (g["min"], g["max"], g["last"]) == (w["min"], w["max"], w["last"])
        assert g["value"] == pytest.approx(w["value"], rel=1e-12)


def test_a_long_series_is_downsampled_in_sql_exactly_as_documented(tenants, pool):
    job = running_job(tenants[0].id)
    draw = random.Random(18)
    # 20,000 points: every step from 1 but the multiples of 7 and a hole in the middle.
    steps = [s for s in range(1, 25_001) if s % 7 and not 9_000 <= s < 10_000][:20_000]
    rows = [(s, draw.uniform(-5, 5) + 1000 / s) for s in steps]
    points = [services.ReportedPoint("loss", s, v) for s, v in rows]
    assert services.record_metric_points(job.pk, 0, points, batch_size=5_000) == 20_000

    client = api(tenants[0].token)
    body = client.get(f"/api/v1/jobs/{job.pk}/metrics?name=loss&points=300").json()
    (loss,) = body["series"]
    assert loss["downsampled"] is True and loss["total_points"] == 20_000
    assert len(loss["points"]) <= 300
    assert_points_match(loss["points"], expected_buckets(rows, 300))

    # The default is 500 points; a range narrows the rows before they are bucketed.
    loss = series_of(client.get(f"/api/v1/jobs/{job.pk}/metrics").json())["loss"]
    assert_points_match(loss["points"], expected_buckets(rows, 500))
    ranged = [(s, v) for s, v in rows if 5_000 <= s <= 15_000]
    loss = client.get(f"/api/v1/jobs/{job.pk}/metrics?name=loss&from=5000&to=15000&points=1000").json()["series"][0]
    assert loss["total_points"] == len(ranged)
    assert_points_match(loss["points"], expected_buckets(ranged, 1000))

    # Fewer points in the range than buckets: the points themselves.
    few = [(s, v) for s, v in rows if 100 <= s <= 200]
    loss = client.get(f"/api/v1/jobs/{job.pk}/metrics?name=loss&from=100&to=200&points=5000").json()["series"][0]
    assert loss["downsampled"] is False and loss["total_points"] == len(few)
    assert [(p["step"], p["value"], p["min"], p["max"]) for p in loss["points"]] == [(s, v, v, v) for s, v in few]

    # A range with nothing in it.
    loss = client.get(f"/api/v1/jobs/{job.pk}/metrics?name=loss&from=30000").json()["series"][0]
    assert (loss["points"], loss["total_points"], loss["downsampled"]) == ([], 0, False)


def test_another_tenants_job_answers_like_a_missing_one(tenants, pool):
    job = running_job(tenants[0].id)
    services.record_metric_points(job.pk, 0, [services.ReportedPoint("loss", 1, 1.0)])
    theirs = api(tenants[1].token).get(f"/api/v1/jobs/{job.pk}/metrics")
    missing = api(tenants[1].token).get("/api/v1/jobs/999999/metrics")
    assert theirs.status_code == missing.status_code == 404
    assert theirs.json()["error"]["code"] == missing.json()["error"]["code"] == "not_found"
    assert b"loss" not in theirs.content


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("points=0", "points"),
        ("points=5001", "points"),
        ("points=many", "points"),
        ("points=1.5", "points"),
        ("from=-1", "from"),
        ("to=x", "to"),
        ("from=10&to=9", "to"),
        ("name=bad%20name", "name"),
        ("name=" + "x" * 65, "name"),
    ],
)
def test_bad_parameters_are_refused_naming_the_parameter(tenants, pool, query, field):
    job = running_job(tenants[0].id)
    response = api(tenants[0].token).get(f"/api/v1/jobs/{job.pk}/metrics?{query}")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
