"""Reads compiled once per process give what the queryset gives, read afresh every time."""

from __future__ import annotations

import uuid
from decimal import Decimal

import pytest
from django.db.models import Exists, OuterRef

from controlplane import compiled_queries
from jobs.models import Device, DeviceHealth, Node, TrainingJob
from tenants.models import NAU_RESOURCE, Quota

pytestmark = pytest.mark.django_db


def _quotas():
    return Quota.objects.order_by("tenant_id", "resource").values_list("tenant_id", "resource", "nominal")


def test_rows_are_the_querysets_own_and_follow_the_database(tenants):
    built = []

    def build():
        built.append(1)
        return _quotas()

    key = f"test.quotas.{uuid.uuid4()}"  # compiled once per process: a key of this run's own
    Quota.objects.update_or_create(tenant_id=tenants[0].id, resource=NAU_RESOURCE, defaults={"nominal": Decimal("2.5")})
    first = compiled_queries.rows(key, build)
    assert first == list(_quotas()) and first  # the same tuples
    Quota.objects.filter(tenant_id=tenants[0].id, resource=NAU_RESOURCE).update(nominal=Decimal("7"))
    again = compiled_queries.rows(key, build)
    assert (tenants[0].id, NAU_RESOURCE, Decimal("7")) in again  # run again, not remembered
    assert again == list(_quotas())
    assert len(built) == 1  # built and compiled once


def _nodes():
    # A JSON column, a joined one, and an annotation (converted by its output field).
    in_use = Device.objects.filter(node=OuterRef("pk"), health=DeviceHealth.CORDONED)
    return (
        Node.objects.order_by("pk")
        .annotate(cordoned=Exists(in_use))
        .values_list("name", "coords", "flavor__name", "cordoned")
    )


def test_json_joined_and_annotated_columns_come_back_as_python_values(pool):
    Device.objects.filter(pk=Device.objects.order_by("pk").values("pk")[:1]).update(health=DeviceHealth.CORDONED)
    rows = compiled_queries.rows(f"test.nodes.{uuid.uuid4()}", _nodes)
    assert rows == list(_nodes()) and rows
    assert any(cordoned is True for *_, cordoned in rows) and any(cordoned is False for *_, cordoned in rows)
    assert all(not isinstance(coords, str) for _, coords, _, _ in rows)  # decoded JSON, not its text


@pytest.mark.parametrize(
    "build",
    [
        lambda: TrainingJob.objects.all(),  # models
        lambda: TrainingJob.objects.values("pk"),  # dicts
        lambda: TrainingJob.objects.values_list("pk", flat=True),  # flat values
    ],
    ids=["models", "dicts", "flat"],
)
def test_only_a_values_list_of_tuples_is_compiled(build):
    with pytest.raises(TypeError, match="only a values_list"):
        compiled_queries.rows(f"test.refused.{uuid.uuid4()}", build)
