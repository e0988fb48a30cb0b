"""The billing API and commands: usage and invoices as JSON and CSV, budgets, invoice runs, reconciliation.

Three tenants: acme and globex used devices in October 2026, initech did not, and sees nothing of
theirs. Money is a decimal string in every answer, never a JSON number.
"""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.utils import timezone
from rest_framework.test import APIClient

from billing import rating
from billing import services as billing
from billing.contracts import UsageInterval
from billing.models import BillingAccount, Invoice, LedgerEntry
from tenants import services as tenants_services

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

OCT = "2026-10"
USAGE_HEADER = [
    "key",
    "job_id",
    "device_id",
    "flavor",
    "period",
    "started_at",
    "ended_at",
    "duration_ms",
    "nau_milli",
    "invoice",
]


def at(day: int, hour: int, minute: int = 0, month: int = 10) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


def interval(tenant, key: str, job_id: int, flavor: str, start: datetime, end: datetime) -> UsageInterval:
    return UsageInterval(
        key=key,
        tenant_id=tenant.id,
        job_id=job_id,
        device_id=f"{flavor}-0/0",
        flavor=flavor,
        started_at=start,
        ended_at=end,
    )


def record(*intervals: UsageInterval) -> None:
    with transaction.atomic():
        billing.record_usage(intervals)
    billing.relay_usage()


@pytest.fixture
def used(tenants):
    """October 2026 at the standard prices (per device-hour: a100 2.10, h100 4.25, tpu-v4 1.95)."""
    acme, globex, _ = tenants
    record(
        interval(acme, "acme:1", 11, "a100-sxm", at(5, 10), at(5, 13)),  # 3 h: 6.30
        interval(acme, "acme:2", 11, "h100-sxm", at(6, 0), at(6, 0, 30)),  # 0.5 h: 2.125, rounded once: 2.13
        # An hour in October and an hour in November: split at midnight UTC, no millisecond lost.
        interval(acme, "acme:3", 12, "tpu-v4", at(31, 23), at(1, 1, month=11)),  # October: 1.95
        interval(globex, "globex-secret-usage", 21, "a100-sxm", at(7, 9), at(7, 10)),
    )
    return tenants


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def manage_client(tenant, scopes: list[str] | None = None) -> APIClient:
    token = tenants_services.issue_token(
        tenant_id=tenant.id, username=tenant.username, name="billing-admin", scopes=scopes or ["read", "manage"]
    )
    return bearer(token.secret)


@pytest.fixture
def operator(db) -> APIClient:
    user = get_user_model().objects.create_user(username="op", password="op-password-1", is_staff=True)
    client = APIClient()
    client.force_login(user)
    return client


def floats_in(value: Any, path: str = "") -> list[str]:
    """Where a JSON document holds a float: money must never be one."""
    if isinstance(value, float):
        return [path]
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in floats_in(item, f"{path}.{key}")]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in floats_in(item, f"{path}[{i}]")]
    return []


def body(response) -> Any:
    data = json.loads(response.content)
    assert not floats_in(data), floats_in(data)
    return data


def refused(response, status: int, field: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error.get("field") == field, error
    assert error["message"]
    return error


def csv_of(response) -> list[list[str]]:
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert response["Content-Disposition"].startswith("attachment; filename=")
    assert response.streaming  # row by row, never the whole export in memory
    return list(csv.reader(io.StringIO(b"".join(response.streaming_content).decode())))


# --- usage ------------------------------------------------------------------------------------------


def test_usage_as_json_lists_the_tenants_ledger_entries(used):
    acme = used[0]
    data = body(bearer(acme.token).get("/api/v1/usage", {"period": OCT}))
    assert (data["period"], data["count"], data["next"]) == (OCT, 3, None)
    assert [e["key"] for e in data["entries"]] == ["acme:1@2026-10", "acme:2@2026-10", "acme:3@2026-10"]
    first = data["entries"][0]
    assert first == {
        "key": "acme:1@2026-10",
        "job_id": 11,
        "device_id": "a100-sxm-0/0",
        "flavor": "a100-sxm",
        "period": OCT,
        "started_at": "2026-10-05T10:00:00.000Z",
        "ended_at": "2026-10-05T13:00:00.000Z",
        "duration_ms": 3 * 3_600_000,
        "nau_milli": 1000,
        "invoice": None,
    }
    # The split usage: its October piece ends at midnight, its November piece starts there.
    split = [e for e in body(bearer(acme.token).get("/api/v1/usage"))["entries"] if e["key"].startswith("acme:3@")]
    assert [(e["period"], e["started_at"], e["duration_ms"]) for e in split] == [
        ("2026-10", "2026-10-31T23:00:00.000Z", 3_600_000),
        ("2026-11", "2026-11-01T00:00:00.000Z", 3_600_000),
    ]


def test_usage_json_comes_in_pages(used):
    acme = used[0]
    client = bearer(acme.token)
    page = body(client.get("/api/v1/usage", {"period": OCT, "limit": 2}))
    assert (page["count"], len(page["entries"])) == (3, 2)
    assert page["next"] == f"/api/v1/usage?period=2026-10&limit=2&cursor={page['next_cursor']}"
    rest = body(client.get(page["next"]))
    assert [e["key"] for e in rest["entries"]] == ["acme:3@2026-10"]
    assert rest["next"] is None and rest["next_cursor"] is None


def test_usage_as_csv_streams_one_row_per_entry(used):
    acme = used[0]
    rows = csv_of(bearer(acme.token).get("/api/v1/usage", {"period": OCT, "format": "csv"}))
    assert rows[0] == USAGE_HEADER
    assert rows[1] == [
        "acme:1@2026-10",
        "11",
        "a100-sxm-0/0",
        "a100-sxm",
        OCT,
        "2026-10-05T10:00:00.000Z",
        "2026-10-05T13:00:00.000Z",
        "10800000",
        "1000",
        "",
    ]
    assert [row[0] for row in rows[1:]] == ["acme:1@2026-10", "acme:2@2026-10", "acme:3@2026-10"]
    assert sum(int(row[7]) for row in rows[1:]) == 3 * 3_600_000 + 1_800_000 + 3_600_000


def test_over_asgi_the_csv_streams_in_chunks_as_it_is_read(used, monkeypatch):
    """Served over ASGI (as in production, by uvicorn), a sync iterator would be read whole first."""
    from asgiref.sync import async_to_sync
    from django.test import AsyncClient

    from billing.api import views

    monkeypatch.setattr(views, "ROWS_PER_CHUNK", 2)
    acme = used[0]

    async def fetch() -> tuple[Any, list[bytes]]:
        response = await AsyncClient().get(
            "/api/v1/usage", {"format": "csv"}, headers={"Authorization": f"Bearer {acme.token}"}
        )
        return response, [chunk async for chunk in response.streaming_content]

    response, chunks = async_to_sync(fetch)()
    assert response.status_code == 200 and response.is_async
    rows = list(csv.reader(io.StringIO(b"".join(chunks).decode())))
    assert rows[0] == USAGE_HEADER and len(rows) == 1 + 4  # the header and four entries
    assert len(chunks) == 3  # two rows a chunk


def test_a_csv_cell_that_a_spreadsheet_would_run_is_written_as_text(tenants):
    acme = tenants[0]
    record(interval(acme, "=HYPERLINK(1)", 13, "a100-sxm", at(2, 0), at(2, 1)))
    rows = csv_of(bearer(acme.token).get("/api/v1/usage", {"format": "csv"}))
    assert rows[1][0] == "'=HYPERLINK(1)@2026-10"


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"period": "October"}, "period"),
        ({"period": "2026-13"}, "period"),
        ({"format": "xml"}, "format"),
        ({"limit": "0"}, "limit"),
        ({"limit": "100001"}, "limit"),
        ({"cursor": "k-1"}, "cursor"),
        ({"limit": "²"}, "limit"),
    ],
)
def test_bad_usage_parameters_are_named(used, query, field):
    refused(bearer(used[0].token).get("/api/v1/usage", query), 400, field)


# --- invoices ---------------------------------------------------------------------------------------


def test_an_operator_run_drafts_then_finalizes_each_tenants_invoice(used, operator):
    initech = used[2]
    drafted = body(operator.post("/api/v1/operator/invoices/run", {"period": OCT}, format="json"))
    assert (drafted["period"], drafted["finalize"], drafted["count"]) == (OCT, False, 2)
    assert sorted((i["tenant"], i["status"], i["total"], i["lines"]) for i in drafted["invoices"]) == [
        ("acme", "draft", "10.38", 3),
        ("globex", "draft", "2.10", 1),
    ]
    finalized = body(operator.post("/api/v1/operator/invoices/run", {"period": OCT, "finalize": True}, format="json"))
    assert {i["status"] for i in finalized["invoices"]} == {"finalized"}
    assert Invoice.objects.filter(period=date(2026, 10, 1)).count() == 2
    # Run again: nothing is left to bill, nothing changes, and still one invoice per tenant and period.
    frozen = list(Invoice.objects.order_by("pk").values())
    again = body(operator.post("/api/v1/operator/invoices/run", {"period": OCT, "finalize": True}, format="json"))
    assert again["count"] == 0 and list(Invoice.objects.order_by("pk").values()) == frozen
    assert not Invoice.objects.filter(tenant_id=initech.id).exists()


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({}, "period"),
        ({"period": "10/2026"}, "period"),
        ({"period": 202610}, "period"),
        ({"period": OCT, "finalize": "yes"}, "finalize"),
        ({"period": OCT, "tenant": "acme"}, "tenant"),
        ([OCT], "body"),
    ],
)
def test_a_bad_run_request_names_the_field_and_changes_nothing(used, operator, payload, field):
    refused(operator.post("/api/v1/operator/invoices/run", payload, format="json"), 400, field)
    assert not Invoice.objects.exists()


def test_a_period_that_has_not_ended_cannot_be_finalized(used, operator):
    record(interval(used[0], "acme:now", 14, "a100-sxm", timezone.now() - timedelta(minutes=5), timezone.now()))
    this_month = f"{timezone.now():%Y-%m}"
    response = operator.post("/api/v1/operator/invoices/run", {"period": this_month, "finalize": True}, format="json")
    assert "has not ended" in refused(response, 409, "period")["message"]
    # Refused before anything ran: October and November, still open, were not finalized either.
    assert not Invoice.objects.exists()
    with pytest.raises(CommandError, match="has not ended"):
        run("run_invoices", "--period", this_month, "--finalize")
    assert not Invoice.objects.exists()


def test_an_operator_finalizes_one_invoice(used, operator):
    acme = used[0]
    draft = billing.draft_invoice(acme.id, date(2026, 10, 1))
    data = body(operator.post(f"/api/v1/operator/invoices/{draft.id}/finalize", {}, format="json"))
    assert (data["number"], data["status"], data["total"]) == (draft.number, "finalized", "10.38")
    assert operator.post("/api/v1/operator/invoices/999999/finalize", {}, format="json").status_code == 404


def test_invoices_list_and_detail_with_lines_by_flavor_and_csv(used):
    acme = used[0]
    billing.run_invoices(date(2026, 10, 1), finalize=True)
    client = bearer(acme.token)
    listed = body(client.get("/api/v1/invoices"))
    assert listed["count"] == 1
    [summary] = listed["invoices"]
    number = f"INV-202610-{acme.id:05d}"
    assert (summary["number"], summary["period"], summary["status"], summary["total"]) == (
        number,
        OCT,
        "finalized",
        "10.38",
    )
    assert summary["url"] == f"/api/v1/invoices/{summary['id']}"

    detail = body(client.get(summary["url"]))
    assert [(ln["job_id"], ln["flavor"], ln["quantity_ms"], ln["amount"]) for ln in detail["lines"]] == [
        (11, "a100-sxm", 10_800_000, "6.30"),
        (11, "h100-sxm", 1_800_000, "2.13"),
        (12, "tpu-v4", 3_600_000, "1.95"),
    ]
    assert detail["lines"][0]["unit_price"] == "2.100000000000" and detail["lines"][0]["hours"] == "3.000000"
    assert sum(Decimal(ln["amount"]) for ln in detail["lines"]) == Decimal(detail["total"])
    assert detail["by_flavor"] == [
        {"flavor": "a100-sxm", "amount": "6.30"},
        {"flavor": "h100-sxm", "amount": "2.13"},
        {"flavor": "tpu-v4", "amount": "1.95"},
    ]

    lines = csv_of(client.get(summary["url"], {"format": "csv"}))
    assert lines[0][:3] == ["invoice", "position", "kind"] and lines[0][-1] == "amount"
    assert [row[-1] for row in lines[1:]] == ["6.30", "2.13", "1.95", "10.38"]
    assert lines[-1][2] == "total" and all(row[0] == number for row in lines[1:])

    invoices = csv_of(client.get("/api/v1/invoices", {"format": "csv"}))
    assert invoices[0] == [
        "number",
        "period",
        "status",
        "currency",
        "price_book",
        "total",
        "created_at",
        "finalized_at",
    ]
    assert invoices[1][:6] == [number, OCT, "finalized", "USD", "standard", "10.38"]

    # The ledger now says which invoice billed each October entry; November's waits.
    entries = body(client.get("/api/v1/usage"))["entries"]
    assert {(e["period"], e["invoice"]) for e in entries} == {(OCT, number), ("2026-11", None)}


def test_the_third_tenant_sees_nothing_of_the_first(used):
    acme, _, initech = used
    billing.run_invoices(date(2026, 10, 1), finalize=True)
    acme_invoice = Invoice.objects.get(tenant_id=acme.id)
    client = bearer(initech.token)
    assert body(client.get("/api/v1/usage"))["count"] == 0
    assert csv_of(client.get("/api/v1/usage", {"format": "csv"})) == [USAGE_HEADER]
    assert body(client.get("/api/v1/invoices")) == {
        "count": 0,
        "invoices": [],
        "limit": 50,
        "next_cursor": None,
        "next": None,
    }
    assert csv_of(client.get("/api/v1/invoices", {"format": "csv"}))[1:] == []
    # Another tenant's invoice answers exactly like a missing one, in JSON as in CSV.
    missing = Invoice.objects.order_by("-pk").first().pk + 1000
    for invoice_id in (acme_invoice.pk, missing):
        for query in ({}, {"format": "csv"}):
            response = client.get(f"/api/v1/invoices/{invoice_id}", query)
            assert response.status_code == 404
            assert response.json() == {"error": {"code": "not_found", "message": f"no invoice {invoice_id}"}}
    spent = body(client.get("/api/v1/billing/budget"))
    assert (spent["spend"], spent["by_flavor"]) == ("0.00", [])
    for response in (client.get("/api/v1/usage"), client.get("/api/v1/invoices"), client.get("/api/v1/billing/budget")):
        text = response.content.decode()
        assert "acme" not in text and "globex-secret-usage" not in text and acme_invoice.number not in text


# --- budgets ----------------------------------------------------------------------------------------


def test_the_budget_counts_this_months_usage_and_takes_new_budgets(tenants):
    acme = tenants[0]
    start = this_month_start()
    record(interval(acme, "acme:month", 15, "a100-sxm", start, start + timedelta(hours=1)))
    client = manage_client(acme)
    data = body(client.get("/api/v1/billing/budget"))
    assert data == {
        "period": f"{start:%Y-%m}",
        "currency": "USD",
        "spend": "2.10",
        "soft_budget": None,
        "hard_budget": None,
        "soft_reached": False,
        "hard_reached": False,
        "alerts": [],
        "reason": None,
        "by_flavor": [{"flavor": "a100-sxm", "spend": "2.10"}],
    }
    data = body(client.put("/api/v1/billing/budget", {"soft_budget": "2", "hard_budget": 2.5}, format="json"))
    assert (data["soft_budget"], data["hard_budget"], data["soft_reached"], data["hard_reached"]) == (
        "2.00",
        "2.50",
        True,
        False,
    )
    # A field left out keeps its value; null clears it.
    data = body(client.put("/api/v1/billing/budget", {"hard_budget": "2.10"}, format="json"))
    assert (data["soft_budget"], data["hard_budget"], data["hard_reached"]) == ("2.00", "2.10", True)
    assert data["reason"].startswith("hard budget reached: USD 2.10 spent of 2.10")
    data = body(client.put("/api/v1/billing/budget", {"soft_budget": None, "hard_budget": None}, format="json"))
    assert (data["soft_budget"], data["hard_budget"]) == (None, None)


def test_the_budget_counts_the_devices_jobs_hold_now(tenants, pool):
    from jobs import services as jobs
    from jobs.models import Allocation, Device, TrainingJob
    from runtime.jobspec import parse_job_spec

    acme, _, initech = tenants
    view = jobs.submit_job(
        tenant_id=acme.id, user_id=None, spec=parse_job_spec({"name": "held", "devices": 1, "flavors": ["tpu-v4"]})
    )
    device = Device.objects.filter(flavor__name="tpu-v4").order_by("pk").first()
    started = max(timezone.now() - timedelta(hours=1), this_month_start())
    Allocation.objects.create(job=TrainingJob.objects.get(pk=view.id), device=device, rank=0, started_at=started)
    held_hours = Decimal(rating.epoch_ms(timezone.now()) - rating.epoch_ms(started)) / 3_600_000
    data = body(bearer(acme.token).get("/api/v1/billing/budget"))
    [flavor] = data["by_flavor"]
    # No usage record exists yet: the spend is the open allocation's, priced up to now.
    assert flavor["flavor"] == "tpu-v4" and data["spend"] == flavor["spend"]
    assert Decimal(data["spend"]) >= (held_hours * Decimal("1.95")).quantize(Decimal("0.01")) - Decimal("0.01")
    assert body(bearer(initech.token).get("/api/v1/billing/budget"))["spend"] == "0.00"


def this_month_start() -> datetime:
    return rating.from_epoch_ms(rating.period_bounds_ms(rating.period_of(rating.epoch_ms(timezone.now())))[0])


def test_usage_that_no_price_covers_is_a_conflict_not_a_crash(tenants):
    from billing.models import Price, PriceBook

    acme = tenants[0]
    book = PriceBook.objects.create(name="h100-only")
    Price.objects.create(book=book, resource="h100-sxm", per_hour=Decimal("4"), effective_from=date(2026, 1, 1))
    BillingAccount.objects.create(tenant_id=acme.id, price_book=book)
    record(interval(acme, "acme:unpriced", 16, "a100-sxm", this_month_start(), this_month_start() + timedelta(hours=1)))
    error = refused(bearer(acme.token).get("/api/v1/billing/budget"), 409, None)
    assert error["code"] == "unpriced" and "'a100-sxm'" in error["message"]


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"soft_budget": "lots"}, "soft_budget"),
        ({"soft_budget": True}, "soft_budget"),
        ({"hard_budget": -1}, "hard_budget"),
        ({"hard_budget": "10.001"}, "hard_budget"),
        ({"hard_budget": "NaN"}, "hard_budget"),
        ({"hard_budget": "1e30"}, "hard_budget"),
        ({"soft_budget": 200, "hard_budget": 100}, "soft_budget"),
        ({"hard_budget": 10}, "hard_budget"),  # below the soft budget already set
        ({"budget": 100}, "budget"),
        ({}, "body"),
        ([100], "body"),
    ],
)
def test_a_bad_budget_names_the_field_and_changes_nothing(tenants, payload, field):
    acme = tenants[0]
    billing.set_budgets(acme.id, soft=Decimal("50.00"), hard=None)
    before = list(BillingAccount.objects.values())
    refused(manage_client(acme).put("/api/v1/billing/budget", payload, format="json"), 400, field)
    assert list(BillingAccount.objects.values()) == before


def test_setting_a_budget_needs_the_manage_scope(tenants):
    acme = tenants[0]
    response = bearer(acme.token).put("/api/v1/billing/budget", {"hard_budget": "1"}, format="json")
    assert response.status_code == 403 and "'manage' scope" in response.json()["error"]["message"]
    assert not BillingAccount.objects.exists()


# --- commands ---------------------------------------------------------------------------------------


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out)
    return out.getvalue()


def test_run_invoices_prints_one_line_per_invoice(used):
    acme = used[0]
    printed = run("run_invoices", "--period", OCT, "--tenant", "acme")
    assert f"INV-202610-{acme.id:05d}" in printed and "draft" in printed and "10.38" in printed
    assert "3 line(s)" in printed and "1 invoice(s) drafted for 2026-10" in printed
    printed = run("run_invoices", "--period", OCT, "--finalize")
    assert printed.count("finalized") == 3  # two invoices and the summary
    with pytest.raises(CommandError, match="no tenant 'nobody'"):
        run("run_invoices", "--period", OCT, "--tenant", "nobody")
    with pytest.raises(CommandError, match="YYYY-MM"):
        run("run_invoices", "--period", "October")


def test_reconcile_usage_balances_allocations_against_the_ledger(tenants, pool):
    from jobs import services as jobs
    from jobs.metering import end_allocations
    from jobs.models import Allocation, Device, TrainingJob
    from runtime.jobspec import parse_job_spec

    acme, globex, _ = tenants
    view = jobs.submit_job(
        tenant_id=acme.id, user_id=None, spec=parse_job_spec({"name": "r", "devices": 2, "flavors": ["tpu-v4"]})
    )
    job = TrainingJob.objects.get(pk=view.id)
    started = timezone.now() - timedelta(hours=2)
    for rank, device in enumerate(Device.objects.filter(flavor__name="tpu-v4").order_by("pk")[:2]):
        Allocation.objects.create(job=job, device=device, rank=rank, started_at=started)
    # Microseconds are truncated per end, exactly as billing counts them.
    ended = timezone.now().replace(microsecond=123_999)
    with transaction.atomic():
        end_allocations(job, ended)
    held = rating.epoch_ms(ended) - rating.epoch_ms(started)
    assert jobs.allocated_ms() == {(acme.id, "tpu-v4"): 2 * held}

    # Before the relay the usage is still in the outbox: it counts, and nothing differs.
    printed = run("reconcile_usage")
    assert "balanced: 1 tenant-flavor row(s), no differences" in printed
    data = json.loads(run("reconcile_usage", "--json", "--relay"))
    assert data["balanced"] and data["differences"] == []
    [row] = data["rows"]
    assert (row["tenant"], row["flavor"], row["allocated_ms"], row["ledger_ms"], row["pending_ms"]) == (
        "acme",
        "tpu-v4",
        2 * held,
        2 * held,
        0,
    )

    # Usage without an allocation behind it is a difference, listed, and the exit status says so.
    record(interval(globex, "globex:stray", 99, "a100-sxm", at(3, 0), at(3, 1)))
    out = io.StringIO()
    with pytest.raises(CommandError) as failed:
        call_command("reconcile_usage", stdout=out)
    assert failed.value.returncode == 1
    assert "differences (1):" in out.getvalue()
    assert "globex a100-sxm: allocations held 0 ms, usage records 3600000 ms" in out.getvalue()
    assert LedgerEntry.objects.filter(tenant_id=globex.id).count() == 1


# --- the admin console ------------------------------------------------------------------------------


def test_the_admin_drafts_and_finalizes_invoices_and_keeps_finalized_ones(used, client):
    from django.contrib.auth import get_user_model

    acme = used[0]
    user = get_user_model().objects.create_superuser(username="root", password="root-password-1")
    client.force_login(user)
    draft = billing.draft_invoice(acme.id, date(2026, 10, 1))
    for url in (
        "/admin/billing/pricebook/",
        "/admin/billing/pricebook/add/",
        "/admin/billing/billingaccount/",
        "/admin/billing/invoice/",
        f"/admin/billing/invoice/{draft.id}/change/",
        "/admin/billing/ledgerentry/",
        "/admin/billing/usagerecord/",
        "/admin/billing/budgetalert/",
    ):
        assert client.get(url).status_code == 200, url
    changelist = "/admin/billing/invoice/"
    client.post(changelist, {"action": "draft_again", "_selected_action": [draft.id]})
    assert Invoice.objects.get(pk=draft.id).status == "draft"
    client.post(changelist, {"action": "finalize", "_selected_action": [draft.id]})
    invoice = Invoice.objects.get(pk=draft.id)
    assert (invoice.status, invoice.total) == ("finalized", Decimal("10.38"))
    # Finalized: shown read-only, never deleted, never drafted again.
    page = client.get(f"/admin/billing/invoice/{draft.id}/change/").content.decode()
    assert 'name="_save"' not in page and "/delete/" not in page
    assert client.post(f"/admin/billing/invoice/{draft.id}/delete/", {"post": "yes"}).status_code == 403
    client.post(changelist, {"action": "draft_again", "_selected_action": [draft.id]})
    assert Invoice.objects.get(pk=draft.id).finalized_at == invoice.finalized_at
    assert client.get("/admin/billing/ledgerentry/add/").status_code == 403
