"""The advisor at submit (POST /api/v1/jobs/advise, and POST /api/v1/jobs?dry_run=true), through the API on
PostgreSQL: where a job would start now and what it costs, why one waits and when it should start, why one
never could (with the counts), the micro-batches and accumulation per flavor, the checkpoint intervals, the
policy that compression: auto would choose, a dry run that stores nothing (not even its Idempotency-Key),
bad specs, and each tenant's own quotas. The demo pool has 2 h100-sxm, 2 a100-sxm, 4 ascend-910b and 4
tpu-v4; admission runs in-process (no worker)."""

from __future__ import annotations

import io
import math
from datetime import datetime, timedelta
from decimal import Decimal

import pytest
from django.test import Client
from django.utils import timezone

from billing import services as billing
from billing.models import BudgetAlert, UsageOutbox
from jobs import services
from jobs.models import AdmissionRequest, JobEvent, JobState, TrainingJob
from runtime.balancing import max_micro_batch
from runtime.comm.auto import choose_policy, lowrank_numbers
from runtime.jobspec import parse_job_spec
from runtime.recovery.advisor import advise as advise_intervals
from runtime.recovery.advisor import job_mtbf_s
from runtime.throughput import Source, ThroughputEntry
from runtime.worker.builtin.shapes import memory_figures, param_shapes
from tenants.models import IdempotencyKey, Quota
from tests.conftest import make_tenant
from tests.integration.test_bundles_api import tar_gz

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

SMALL = {"name": "small", "devices": 2, "flavors": ["h100-sxm", "a100-sxm"], "workload": {"steps": 5}}


def _client(token: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token}"})


def _advise(token: str, spec: dict) -> dict:
    response = _client(token).post("/api/v1/jobs/advise", spec, content_type="application/json")
    assert response.status_code == 200, response.content
    return response.json()


def _submit(tenant, name: str, devices: int, flavors: list[str], steps: int = 1100) -> int:
    spec = {"name": name, "devices": devices, "flavors": flavors, "workload": {"steps": steps, "global_batch": 96}}
    return services.submit_job(tenant_id=tenant.id, user_id=None, spec=parse_job_spec(spec)).id


def test_a_job_that_fits_now_is_told_where_what_it_charges_and_costs(tenants, pool):
    body = _advise(tenants[0].token, SMALL)
    admission, start, cost = body["admission"], body["start"], body["cost"]
    assert admission["verdict"] == "now" and admission["devices"] == {"h100-sxm": 2}
    assert admission["reasoning"][0] == "Would be admitted now, on 2 h100-sxm."
    assert start["wait_s"] == 0.0 and start["jobs_ending"] == 0
    # An h100-sxm is 989/312 = 3.170 NAU to a class nobody measured; the demo prices are in USD.
    assert cost["nau"] == pytest.approx(6.34) and cost["nau_per_device"]["a100-sxm"] == 1.0
    assert cost["currency"] == "USD" and float(cost["cost_per_hour"]) > 0
    assert cost["cost_per_hour"] in cost["reasoning"][0] and "6.340 NAU" in cost["reasoning"][0]
    assert body["spec"]["name"] == "small" and len(body["summary"]) == 6
    assert body["summary"][0] == admission["reasoning"][0]
    assert not TrainingJob.objects.exists()


def test_a_job_that_must_wait_says_why_and_when_it_should_start(tenants, pool):
    acme, globex, _ = tenants
    # synthetic-mlp on two h100s trains 192 samples/s (a benchmark): 96 per device.
    services.store_benchmarks([ThroughputEntry("synthetic-mlp", "h100-sxm", 2, 192.0, Source.BENCHMARK, 10)])
    theirs = _submit(globex, "theirs", 2, ["h100-sxm"])
    assert services.admit_queued_jobs() == [theirs]
    # It runs at 96 samples/s, a step a second, with 1,000 steps left: it ends in about 1,000 s.
    TrainingJob.objects.filter(pk=theirs).update(state=JobState.RUNNING, samples_per_s=96.0, steps_done=100)
    # Ahead of the advised job in its own tenant's queue: 1,000 steps of 96 at 192 samples/s, 500 s.
    _submit(acme, "ahead", 2, ["h100-sxm"], steps=1000)
    assert services.admit_queued_jobs() == []

    before = timezone.now()
    body = _advise(acme.token, {**SMALL, "flavors": ["h100-sxm"]})
    admission, start = body["admission"], body["start"]
    assert admission["verdict"] == "waits" and admission["reason"].startswith("waiting for 2 devices")
    assert admission["reasoning"][0].startswith("Would wait: waiting for 2 devices; free now: 0 h100-sxm")
    expected = datetime.fromisoformat(start["expected_at"])
    assert before + timedelta(seconds=1499) <= expected <= timezone.now() + timedelta(seconds=1501)
    assert start["wait_s"] == pytest.approx(1500, abs=2)
    assert (start["jobs_ending"], start["jobs_first"]) == (2, 1)
    assert start["reasoning"][0].startswith("Expected start: in about 25 min")
    # The cost is that of where it should start; another tenant's job is not named.
    assert body["batch"]["placement"] == "estimated start" and body["cost"]["nau"] == pytest.approx(6.34)
    assert f"job {theirs}" not in str(body) and "globex" not in str(body)


def test_a_job_that_could_never_start_is_told_why_with_the_counts(tenants, pool):
    body = _advise(tenants[0].token, {**SMALL, "devices": 8, "flavors": ["tpu-v4"]})
    admission = body["admission"]
    assert admission["verdict"] == "never" and admission["devices"] == {}
    assert "the pool has 4 tpu-v4 and this job needs 8" in admission["reason"]
    assert body["summary"][0].startswith("Never: the pool has 4 tpu-v4 and this job needs 8, so it could never start")
    assert body["start"]["expected_at"] is None and body["cost"]["nau"] is None
    mixed = _advise(tenants[0].token, {**SMALL, "devices": 5, "flavors": ["h100-sxm", "a100-sxm"]})
    assert "the pool has 2 h100-sxm and 2 a100-sxm (4 in all) and this job needs 5" in mixed["admission"]["reason"]
    # Submit refuses it with the same reason; a dry run too, unless it may wait for capacity.
    spec = {**SMALL, "devices": 8, "flavors": ["tpu-v4"]}
    for path in ("/api/v1/jobs", "/api/v1/jobs?dry_run=true"):
        refused = _client(tenants[0].token).post(path, spec, content_type="application/json")
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "never_fits"
        assert "the pool has 4 tpu-v4 and this job needs 8" in refused.json()["error"]["message"]
    waits = _client(tenants[0].token).post(
        "/api/v1/jobs?dry_run=true", {**spec, "wait_for_capacity": True}, content_type="application/json"
    )
    assert waits.status_code == 200 and waits.json()["admission"]["verdict"] == "never"
    assert not TrainingJob.objects.exists()


def test_micro_batches_fit_seventy_percent_of_each_flavors_memory_and_accumulate_beyond(tenants, pool):
    spec = {
        "name": "wide",
        "devices": 2,
        "flavors": ["h100-sxm", "tpu-v4"],
        "workload": {"kind": "builtin", "model": "charlm", "hidden": 4096, "global_batch": 2048},
    }
    batch = _advise(tenants[0].token, spec)["batch"]
    params, activation_bytes = memory_figures("charlm", 4096)
    caps = {
        gib: max_micro_batch(gib * 2**30, param_count=params, activation_bytes_per_sample=activation_bytes)
        for gib in (80, 32)
    }
    assert (batch["param_count"], batch["activation_bytes_per_sample"]) == (params, activation_bytes)
    h100, tpu = batch["flavors"]
    assert (h100["flavor"], h100["max_micro_batch"], h100["devices"]) == ("h100-sxm", caps[80], 2)
    assert (tpu["flavor"], tpu["max_micro_batch"], tpu["devices"], tpu["micro_batch"]) == ("tpu-v4", caps[32], 0, None)
    # 2,048 samples over two devices that hold 472 each: three micro-steps of at most 472 per device.
    assert batch["accumulation"] == math.ceil(2048 / (2 * caps[80])) == 3
    assert h100["micro_batch"] <= caps[80]
    assert batch["reasoning"][0].startswith("On 2 h100-sxm (now), the global batch of 2,048 runs as")
    assert "3 accumulation micro-steps" in batch["reasoning"][0]

    # A model whose state alone overflows 70% of a tpu-v4: not one sample fits there.
    huge = _advise(tenants[0].token, {**spec, "workload": {**spec["workload"], "hidden": 8192, "global_batch": 64}})
    assert huge["batch"]["flavors"][1]["max_micro_batch"] is None
    assert "tpu-v4: not one sample" in huge["batch"]["reasoning"][1]

    # The tenant's own code: no memory model, and that is said rather than guessed.
    bundle = services.store_bundle(
        tenant_id=tenants[0].id, user_id=None, upload_file=io.BytesIO(tar_gz({"train.py": b"pass\n"})), name="code"
    )
    code = {"kind": "python", "bundle": bundle.ref, "entrypoint": "train.py", "global_batch": 64}
    own = _advise(tenants[0].token, {**SMALL, "devices": 6, "flavors": ["tpu-v4", "ascend-910b"], "workload": code})
    assert own["batch"]["param_count"] is None and own["batch"]["accumulation"] is None
    assert own["batch"]["reasoning"][0].startswith(
        "Micro-batches unknown: Polychip has a memory model for the built-in"
    )
    assert own["comm"]["auto_would_choose"] is None


def test_checkpoint_intervals_come_from_measured_saves_and_the_pools_failure_rate(tenants, pool):
    acme = tenants[0]
    spec = {**SMALL, "flavors": ["h100-sxm"]}
    unknown = _advise(acme.token, spec)["checkpoint"]
    assert unknown["weights_every"] is None and unknown["spec_weights_every"] == 50
    assert unknown["reasoning"][0].startswith("Checkpoint intervals unknown: no measured speed for synthetic-mlp")

    # A job of the class saved four checkpoints at 50 ms each; the class trains 96 samples/s per h100.
    services.store_benchmarks([ThroughputEntry("synthetic-mlp", "h100-sxm", 2, 192.0, Source.BENCHMARK, 10)])
    done = _submit(acme, "done", 1, ["h100-sxm"])
    TrainingJob.objects.filter(pk=done).update(
        state=JobState.SUCCEEDED, recovery={"checkpoints": {"count": 4, "stall_ms_sum": 200.0, "write_ms_sum": 9.0}}
    )
    checkpoint = _advise(acme.token, spec)["checkpoint"]
    rate = 0.00004  # the configured prior: this pool has run under 100 device-hours
    expected = advise_intervals(0.05, job_mtbf_s(2, rate), 96 / 192.0)
    assert (checkpoint["save_cost_s"], checkpoint["step_time_s"]) == (0.05, 0.5)
    assert (checkpoint["weights_every"], checkpoint["optimizer_every"]) == (
        expected.weights_every,
        expected.optimizer_every,
    )
    assert (checkpoint["young_s"], checkpoint["daly_s"]) == (
        pytest.approx(expected.young_s),
        pytest.approx(expected.daly_s),
    )
    assert checkpoint["reasoning"][0].startswith(f"Checkpoints: weights every {expected.weights_every:,} steps")
    assert "Young's" in checkpoint["reasoning"][-1]


def test_auto_compression_is_chosen_for_the_link_the_placement_crosses(tenants, pool):
    acme = tenants[0]
    one_vendor = _advise(acme.token, {**SMALL, "flavors": ["h100-sxm"]})["comm"]
    assert (one_vendor["auto_would_choose"], one_vendor["vendor_groups"]) == ("none", 1)
    assert "one vendor group" in one_vendor["reasoning"][0]

    # Six devices of tpu-v4 or ascend-910b: 4 + 2, two vendors, over a link a job measured at 1 Gbit/s.
    done = _submit(acme, "done", 1, ["tpu-v4"])
    TrainingJob.objects.filter(pk=done).update(
        state=JobState.SUCCEEDED, comm_stats={"ran": {"link_gbit_measured": 1.0}}
    )
    spec = {
        "name": "mixed",
        "devices": 6,
        "flavors": ["tpu-v4", "ascend-910b"],
        "workload": {"kind": "builtin", "model": "charlm", "hidden": 256},
        "comm": {"compression": "topk"},
    }
    body = _advise(acme.token, spec)
    comm = body["comm"]
    assert body["admission"]["devices"] == {"ascend-910b": 2, "tpu-v4": 4}
    assert (comm["requested"], comm["vendor_groups"], comm["link_gbit"]) == ("topk", 2, 1.0)
    shapes = param_shapes("charlm", 256)
    matrix, lowrank = lowrank_numbers(shapes, 4)
    expected = choose_policy(
        1e9 / 8, sum(math.prod(s) for s in shapes), matrix_params=matrix, lowrank_params=lowrank, members=2
    )
    assert comm["auto_would_choose"] == expected.compression != "none"
    assert "the spec asks for topk" in comm["reasoning"][0]
    assert comm["reasoning"][1].startswith("Cross-group link measured by 1 recent job(s) at 1.00 Gbit/s")


def test_a_dry_run_checks_and_advises_and_stores_nothing_not_even_its_key(tenants, pool):
    client = _client(tenants[0].token)
    counts = (TrainingJob.objects.count(), JobEvent.objects.count(), IdempotencyKey.objects.count())
    dry = client.post(
        "/api/v1/jobs?dry_run=true", SMALL, content_type="application/json", headers={"Idempotency-Key": "k-1"}
    )
    assert dry.status_code == 200, dry.content
    assert dry.json()["admission"]["verdict"] == "now" and dry.json()["spec"]["name"] == "small"
    assert (TrainingJob.objects.count(), JobEvent.objects.count(), IdempotencyKey.objects.count()) == counts
    # The key is still free for the real submit, which stores its job once.
    real = client.post("/api/v1/jobs", SMALL, content_type="application/json", headers={"Idempotency-Key": "k-1"})
    assert real.status_code == 201 and not real.has_header("Idempotency-Replayed")
    assert TrainingJob.objects.count() == counts[0] + 1
    # A flag that is not one is refused, naming it.
    bad = client.post("/api/v1/jobs?dry_run=maybe", SMALL, content_type="application/json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "dry_run"
    assert TrainingJob.objects.count() == counts[0] + 1


def test_asking_leaves_no_trace_even_for_a_tenant_past_its_budgets(tenants, pool):
    """The advisor, a dry run and a preview rate the tenant's budgets as the cycle does, but a question
    raises no budget alert, asks for no cycle, meters nothing and keeps no Idempotency-Key."""
    acme = tenants[0]
    billing.set_budgets(acme.id, soft=Decimal("0.00"), hard=Decimal("0.00"))  # spend 0 reaches both
    client = _client(acme.token)

    def traces() -> tuple[int, ...]:
        return tuple(
            model.objects.count()
            for model in (TrainingJob, JobEvent, IdempotencyKey, BudgetAlert, AdmissionRequest, UsageOutbox)
        )

    before = traces()
    for n, path in enumerate(("/api/v1/jobs/advise", "/api/v1/jobs?dry_run=true", "/api/v1/jobs/preview")):
        response = client.post(path, SMALL, content_type="application/json", headers={"Idempotency-Key": f"q-{n}"})
        assert response.status_code == 200, response.content
        assert "hard budget reached" in response.json()["admission"]["reason"], response.json()["admission"]
    assert traces() == before == (0, 0, 0, 0, 0, 0)
    # The cycle itself does raise them, once each.
    services.admit_queued_jobs()
    assert sorted(BudgetAlert.objects.values_list("level", flat=True)) == []  # nothing of acme's waits yet
    _submit(acme, "real", 2, ["h100-sxm"])
    services.admit_queued_jobs()
    assert sorted(BudgetAlert.objects.values_list("level", flat=True)) == ["hard", "soft"]


def test_a_bad_spec_is_refused_with_every_field_named(tenants, pool):
    client = _client(tenants[0].token)
    bad = {"name": "bad", "devices": 0, "flavors": ["h100-sxm", "no-such-chip"], "workload": {"global_batch": 0}}
    response = client.post("/api/v1/jobs/advise", bad, content_type="application/json")
    assert response.status_code == 400
    fields = {problem["field"] for problem in response.json()["error"]["errors"]}
    assert {"devices", "workload.global_batch"} <= fields and any(f.startswith("flavors") for f in fields), fields
    yaml = client.post(
        "/api/v1/jobs/advise", "name: y\ndevices: 1\nflavors: [tpu-v4]\n", content_type="application/yaml"
    )
    assert yaml.status_code == 200 and yaml.json()["admission"]["devices"] == {"tpu-v4": 1}
    # Reading, not changing: no token, no answer.
    assert Client().post("/api/v1/jobs/advise", SMALL, content_type="application/json").status_code == 401


def test_each_tenant_is_advised_under_its_own_quotas(pool):
    lab, neighbour = make_tenant("lab", nau_quota=None), make_tenant("neighbour", nau_quota=None)
    Quota.objects.create(tenant_id=lab.id, resource="ascend-910b", nominal=2)
    Quota.objects.create(tenant_id=neighbour.id, resource="ascend-910b", nominal=4)
    spec = {**SMALL, "devices": 3, "flavors": ["ascend-910b"]}
    ours = _advise(lab.token, spec)["admission"]
    assert ours["verdict"] == "never" and "your tenant may hold at most 2" in ours["reason"]
    theirs = _advise(neighbour.token, spec)["admission"]
    assert theirs["verdict"] == "now" and theirs["devices"] == {"ascend-910b": 3}
    # A flavor without any quota of the tenant's: never, in admission's words.
    assert "no quota for tpu-v4" in _advise(lab.token, {**spec, "flavors": ["tpu-v4"]})["admission"]["reason"]
