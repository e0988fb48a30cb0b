"""A job's communication through the API: the comm spec is checked and kept, and rank 0's telemetry
(the policy that ran and why, per-step bytes and times, the run's summary) shows in the job's JSON."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from jobs import services
from jobs.models import JobState, TrainingJob

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

SPEC = {"name": "comm", "devices": 2, "flavors": ["tpu-v4", "ascend-910b"], "workload": {"steps": 50}}
GROUPS = [[0], [1]]


def submit(token: str, body: object):
    return Client().post(
        "/api/v1/jobs", body, content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )


def get_job(token: str, job_id: int):
    return Client().get(f"/api/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {token}"})


def ingest(job_id: int, events: list[dict]):
    token = services.ingest_token(TrainingJob.objects.get(pk=job_id))
    return Client().post(
        f"/api/v1/ingest/jobs/{job_id}/telemetry",
        {"events": events},
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )


def running(token: str, comm: dict | None = None) -> int:
    body = {**SPEC, "comm": comm} if comm is not None else SPEC
    response = submit(token, body)
    assert response.status_code == 201, response.content
    job_id = response.json()["id"]
    TrainingJob.objects.filter(pk=job_id).update(state=JobState.RUNNING)
    return job_id


def comm_event(rank: int, **more: object) -> dict:
    return {
        "kind": "comm",
        "rank": rank,
        "ts": time.time(),
        "policy": "powersgd (rank 4)",
        "compression": "powersgd",
        "reason": "auto chose powersgd: cross-group link measured at 0.98 Gbit/s; the dense exchange is slow",
        "hierarchical": True,
        "groups": GROUPS,
        "buckets": 3,
        "overlap": True,
        "link": {"mode": "token_bucket", "gbit": 1.0},
        "link_gbit_measured": 0.98,
        **more,
    }


def step(rank: int, number: int, *, cross: int, collective_s: float = 0.04, hidden: float = 0.75) -> dict:
    return {
        "kind": "step",
        "rank": rank,
        "ts": time.time(),
        "step": number,
        "total_steps": 50,
        "loss": 2.0,
        "samples": 48,
        "samples_per_s": 500.0,
        "step_time_s": 0.1,
        "flavor": "tpu-v4" if rank == 0 else "ascend-910b",
        "comm_bytes_intra": 0,
        "comm_bytes_cross": cross,
        "collective_s": collective_s,
        "exposed_s": collective_s * (1 - hidden),
        "hidden_share": hidden,
    }


def summary(rank: int, *, cross: float) -> dict:
    return {
        "kind": "comm_summary",
        "rank": rank,
        "ts": time.time(),
        "steps": 50,
        "bytes_intra_per_step": 0.0,
        "bytes_cross_per_step": cross,
        "collective_s_per_step": 0.035,
        "exposed_s_per_step": 0.007,
        "hidden_share": 0.8,
    }


@pytest.mark.parametrize(
    ("comm", "field"),
    [
        ({"compression": "zip"}, "comm.compression"),
        ({"density": 0}, "comm.density"),
        ({"density": 1.5}, "comm.density"),
        ({"rank": 0}, "comm.rank"),
        ({"hierarchical": "yes"}, "comm.hierarchical"),
        ({"compresion": "topk"}, "comm.compresion"),
        ("topk", "comm"),
    ],
)
def test_a_bad_comm_spec_is_refused_naming_the_field(tenants, pool, comm, field):
    response = submit(tenants[0].token, {**SPEC, "comm": comm})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("invalid_spec", field)
    assert not TrainingJob.objects.filter(tenant_id=tenants[0].id).exists()


def test_a_valid_comm_spec_is_kept_and_shown_back(tenants, pool):
    response = submit(tenants[0].token, {**SPEC, "comm": {"compression": "topk", "density": 0.01}})
    assert response.status_code == 201, response.content
    created = response.json()
    assert created["spec"]["comm"]["compression"] == "topk" and created["spec"]["comm"]["density"] == 0.01
    requested = created["comm"]["requested"]
    assert (requested["compression"], requested["density"], requested["hierarchical"]) == ("topk", 0.01, True)
    assert created["comm"]["policy"] is None and created["comm"]["per_step"] is None  # nothing ran yet

    # A spec without comm asks for dense fp32, with the defaults.
    plain = submit(tenants[0].token, {**SPEC, "name": "plain"}).json()
    assert plain["comm"]["requested"]["compression"] == "none"


def test_rank_0s_comm_telemetry_reaches_the_job_json(tenants, pool):
    acme = tenants[0]
    job_id = running(acme.token, {"compression": "auto"})
    assert ingest(job_id, [comm_event(0), step(0, 1, cross=1_200_000), step(0, 2, cross=800_000)]).json() == {
        "applied": 3
    }

    comm = get_job(acme.token, job_id).json()["comm"]
    assert comm["requested"]["compression"] == "auto"
    assert (comm["policy"], comm["compression"]) == ("powersgd (rank 4)", "powersgd")
    assert comm["reason"].startswith("auto chose powersgd")
    assert (comm["hierarchical"], comm["groups"], comm["buckets"], comm["overlap"]) == (True, GROUPS, 3, True)
    assert comm["link"] == {"mode": "token_bucket", "gbit": 1.0} and comm["link_gbit_measured"] == 0.98
    per_step = comm["per_step"]
    assert (per_step["source"], per_step["step"], per_step["bytes_cross"]) == ("step", 2, 800_000)
    assert (per_step["bytes_intra"], per_step["collective_s"], per_step["hidden_share"]) == (0, 0.04, 0.75)
    assert per_step["exposed_s"] == pytest.approx(0.01)

    # An older step replayed late does not move the figures back.
    ingest(job_id, [step(0, 1, cross=1_200_000)])
    assert get_job(acme.token, job_id).json()["comm"]["per_step"]["step"] == 2

    # At the end, the run's averages replace the latest step's figures; the list shows the same.
    ingest(job_id, [summary(0, cross=950_000.0)])
    listed = next(
        j
        for j in Client().get("/api/v1/jobs", headers={"Authorization": f"Bearer {acme.token}"}).json()["jobs"]
        if j["id"] == job_id
    )
    per_step = listed["comm"]["per_step"]
    assert (per_step["source"], per_step["steps"], per_step["bytes_cross"]) == ("run", 50, 950_000.0)
    assert (per_step["collective_s"], per_step["exposed_s"], per_step["hidden_share"]) == (0.035, 0.007, 0.8)


def test_other_ranks_do_not_overwrite_rank_0s_figures(tenants, pool):
    acme = tenants[0]
    job_id = running(acme.token, {"compression": "auto"})
    ingest(job_id, [comm_event(0), step(0, 3, cross=500_000), summary(0, cross=450_000.0)])
    ingest(
        job_id,
        [
            comm_event(1, policy="none", compression="none", reason="something else", groups=[[0, 1]]),
            step(1, 4, cross=0, collective_s=0.5, hidden=0.0),
            summary(1, cross=0.0),
        ],
    )
    comm = get_job(acme.token, job_id).json()["comm"]
    assert (comm["policy"], comm["groups"]) == ("powersgd (rank 4)", GROUPS)
    assert (comm["per_step"]["source"], comm["per_step"]["bytes_cross"]) == ("run", 450_000.0)
    stored = TrainingJob.objects.get(pk=job_id).comm_stats
    assert stored["last_step"]["step"] == 3 and stored["last_step"]["comm_bytes_cross"] == 500_000
    # Rank 1's step still counts as its own progress.
    assert TrainingJob.objects.get(pk=job_id).rank_stats["1"]["step"] == 4


@pytest.mark.parametrize(
    ("event", "field"),
    [
        ({**step(0, 1, cross=10), "comm_bytes_cross": -1}, "events[0].comm_bytes_cross"),
        ({**step(0, 1, cross=10), "hidden_share": "most"}, "events[0].hidden_share"),
        ({**step(0, 1, cross=10), "comm_bytes_intra": 1.5}, "events[0].comm_bytes_intra"),
        (comm_event(0, groups=[[0], "1"]), "events[0].groups"),
        (comm_event(0, hierarchical="yes"), "events[0].hierarchical"),
        (comm_event(0, link="fast"), "events[0].link"),
        ({**summary(0, cross=1.0), "steps": 2.5}, "events[0].steps"),
    ],
)
def test_malformed_comm_telemetry_is_refused_naming_the_field(tenants, pool, event, field):
    job_id = running(tenants[0].token)
    response = ingest(job_id, [event])
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field
    assert TrainingJob.objects.get(pk=job_id).comm_stats == {}


def test_another_tenants_job_comm_is_not_found(tenants, pool):
    acme, globex = tenants[0], tenants[1]
    job_id = running(acme.token, {"compression": "topk", "density": 0.01})
    ingest(job_id, [comm_event(0), step(0, 1, cross=1000)])
    assert get_job(globex.token, job_id).status_code == 404
    listed = Client().get("/api/v1/jobs", headers={"Authorization": f"Bearer {globex.token}"}).json()["jobs"]
    assert all(j["id"] != job_id for j in listed)
