"""Usage records: integer milliseconds, one per allocation, and a replay changes nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

from billing import services as billing
from billing.contracts import UsageInterval
from billing.models import UsageRecord

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

START = datetime(2026, 12, 1, 23, 59, 59, 999_999, tzinfo=UTC)


def interval(tenant_id: int, key: str, held: timedelta) -> UsageInterval:
    return UsageInterval(
        key=key,
        tenant_id=tenant_id,
        job_id=7,
        device_id="gpu-a100-0/0",
        flavor="a100-sxm",
        started_at=START,
        ended_at=START + held,
    )


def test_durations_are_whole_milliseconds_between_truncated_ends():
    # Both ends are cut to the millisecond, then subtracted: back-to-back intervals on one device
    # then tile exactly, with no millisecond lost or counted twice between them. START sits at
    # .999999 s, so it counts from .999; the end, 4.999 ms later past 2 d 3 s, lands at .004998 → .004.
    held = timedelta(days=2, seconds=3, microseconds=4_999)
    assert billing.duration_ms(interval(1, "k", held)) == 2 * 86_400_000 + 3_000 + 5
    first = interval(1, "a", timedelta(microseconds=1_500))
    second = UsageInterval(**{**first.__dict__, "key": "b", "started_at": first.ended_at, "ended_at": START + held})
    assert billing.duration_ms(first) + billing.duration_ms(second) == billing.duration_ms(interval(1, "c", held))


def test_replaying_the_same_usage_changes_nothing(tenants):
    acme = tenants[0]
    first = [interval(acme.id, "allocation:1", timedelta(seconds=90)), interval(acme.id, "allocation:2", timedelta(0))]
    with transaction.atomic():
        assert billing.record_usage(first) == 2
    with transaction.atomic():
        assert billing.record_usage(first) == 0
    # The same key with other figures is a caller's bug: refused, and the whole change rolls back.
    with pytest.raises(billing.UsageConflict, match="allocation:1"), transaction.atomic():
        billing.record_usage(
            [interval(acme.id, "allocation:3", timedelta(1)), interval(acme.id, "allocation:1", timedelta(hours=5))]
        )
    assert sorted(UsageRecord.objects.values_list("key", "duration_ms")) == [
        ("allocation:1", 90_000),
        ("allocation:2", 0),
    ]
    [row] = billing.usage_by_flavor(tenant_id=acme.id)
    assert (row.flavor, row.devices, row.duration_ms, row.device_seconds) == ("a100-sxm", 1, 90_000, 90.0)
    assert billing.usage_by_flavor(tenant_id=tenants[2].id) == []


def test_usage_is_only_written_inside_the_change_that_ends_it(tenants):
    with pytest.raises(RuntimeError, match="inside the transaction"):
        billing.record_usage([interval(tenants[0].id, "allocation:9", timedelta(seconds=1))])
    with pytest.raises(ValueError, match="ended_at is before started_at"), transaction.atomic():
        billing.record_usage([interval(tenants[0].id, "allocation:9", timedelta(seconds=-1))])
    assert not UsageRecord.objects.exists()
