"""Reads compiled once per process give what the queryset gives, read afresh every time."""

from __future__ import annotations

from decimal import Decimal

import pytest

from controlplane import compiled_queries
from jobs.models import Node, TrainingJob
from tenants.models import NAU_RESOURCE, Quota

pytestmark = pytest.mark.django_db


def _quotas():
    return Quota.objects.order_by("tenant_id", "resource").values_list("tenant_id", "resource", "nominal")


def test_rows_are_the_querysets_own_and_follow_the_database(tenants):
    built = []

    def build():
        built.append(1)
        return _quotas()

    Quota.objects.update_or_create(tenant_id=tenants[0].id, resource=NAU_RESOURCE, defaults={"nominal": Decimal("2.5")})
    first = compiled_queries.rows("test.quotas", build)
    assert first == list(_quotas()) and first  # the same tuples, converters applied (Decimal stays Decimal)
    assert any(isinstance(nominal, Decimal) for _, _, nominal in first)
    Quota.objects.filter(tenant_id=tenants[0].id, resource=NAU_RESOURCE).update(nominal=Decimal("7"))
    again = compiled_queries.rows("test.quotas", build)
    assert (tenants[0].id, NAU_RESOURCE, Decimal("7")) in again  # run again, not remembered
    assert again == list(_quotas())
    assert len(built) == 1  # built and compiled once


def test_json_and_joined_columns_come_back_as_python_values(pool):
    rows = compiled_queries.rows(
        "test.nodes", lambda: Node.objects.order_by("pk").values_list("name", "coords", "flavor__name")
    )
    assert rows == list(Node.objects.order_by("pk").values_list("name", "coords", "flavor__name"))
    assert rows


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
        compiled_queries.rows(f"test.refused.{id(build)}", build)
