"""A job that could never start is refused at submit, naming why, unless it may wait for capacity.

The demo pool (runtime/pools/demo.yaml): 2 h100-sxm, 2 a100-sxm, 4 ascend-910b and 4 tpu-v4. Quotas are
set per test; the fixture tenants hold 1,000 NAU and no device quotas.
"""

from __future__ import annotations

import pytest
from django.test import Client

from jobs.models import TrainingJob
from tenants.models import Cohort, Quota, Tenant
from tests.conftest import make_tenant

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def _post(token: str, spec: dict):
    return Client(headers={"Authorization": f"Bearer {token}"}).post(
        "/api/v1/jobs", spec, content_type="application/json"
    )


def _spec(devices: int, flavors: list[str], **more) -> dict:
    return {"name": "big", "devices": devices, "flavors": flavors, "workload": {"steps": 5}, **more}


def _refusal(response) -> str:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("never_fits", "devices")
    return error["message"]


def test_a_gang_larger_than_its_flavors_in_the_pool_is_refused(tenants, pool):
    message = _refusal(_post(tenants[0].token, _spec(5, ["tpu-v4"])))
    assert "the pool has 4 tpu-v4 and this job needs 5, so it could never start" in message
    assert "wait_for_capacity" in message
    assert not TrainingJob.objects.exists()


def test_the_same_gang_fits_when_it_may_mix_flavors(tenants, pool):
    # 4 tpu-v4 + 4 ascend-910b: neither alone holds 6, both together do.
    assert _post(tenants[0].token, _spec(6, ["tpu-v4", "ascend-910b"])).status_code == 201


def test_one_that_may_wait_for_capacity_is_queued(tenants, pool):
    response = _post(tenants[0].token, _spec(64, ["tpu-v4"], wait_for_capacity=True))
    assert response.status_code == 201
    assert response.json()["state"] == "queued" and response.json()["spec"]["wait_for_capacity"] is True


def test_more_than_quota_and_cohort_could_ever_give_is_refused_in_admissions_words(pool):
    lab = make_tenant("lab", nau_quota=None)
    Quota.objects.create(tenant_id=lab.id, resource="ascend-910b", nominal=2)
    message = _refusal(_post(lab.token, _spec(3, ["ascend-910b"])))
    assert "could never start, even with the whole pool idle" in message
    assert "may hold at most 2" in message
    # No quota at all for a flavor is never, too.
    assert "no quota for tpu-v4" in _refusal(_post(lab.token, _spec(1, ["tpu-v4"])))


def test_what_the_cohort_could_lend_counts(pool):
    lab, neighbour = make_tenant("lab", nau_quota=None), make_tenant("neighbour", nau_quota=None)
    Quota.objects.create(tenant_id=lab.id, resource="ascend-910b", nominal=1)
    Quota.objects.create(tenant_id=neighbour.id, resource="ascend-910b", nominal=2)
    cohort = Cohort.objects.create(name="labs")
    Tenant.objects.filter(pk__in=[lab.id, neighbour.id]).update(cohort=cohort)
    # 1 of its own and 2 its neighbour could lend: 3 fits some day (even if the neighbour uses them now).
    assert _post(lab.token, _spec(3, ["ascend-910b"])).status_code == 201
    assert "may hold at most 3" in _refusal(_post(lab.token, _spec(4, ["ascend-910b"])))
    # The neighbour lends at most 1: then 2 is the most.
    Quota.objects.filter(tenant_id=neighbour.id).update(lending_limit=1)
    assert "may hold at most 2" in _refusal(_post(lab.token, _spec(3, ["ascend-910b"])))
