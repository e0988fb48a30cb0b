"""Billing figures (issue 8): crash trials, dedup under concurrency, ingest rates, invoicing at scale.

    .venv/bin/python bench/billing.py [--quick] [--trials N]

Runs from the repository root against PostgreSQL and Redis on this host. It creates a scratch database,
polychip_bench_billing (dropped first if an earlier run left it, and dropped at the end), migrates it,
and uses Redis db 13 as the Celery broker (emptied before and after). POLYCHIP_BENCH_POSTGRES (default
postgres://postgres@127.0.0.1:5432) and POLYCHIP_BENCH_REDIS (default redis://127.0.0.1:6379/13)
point elsewhere. Nothing else is touched.

1. Crash trials (tests/billing_crash.py, as the CI test runs them): a flush of 800 usage records
   is killed at a uniformly random instant within its measured duration: kill -9 of the Celery
   worker's pool child or of the whole worker, of the relay process (manage.py relay_usage --loop),
   or pg_terminate_backend of the worker's or the relay's connection; a fresh relay finishes; the
   ledger is rated against the ground truth per tenant and flavor. 200 trials (5, one of each kind,
   with --quick): crash_trials, ledger_mismatch_cents, lost_records, double_counted_records;
   crash_mid_flush_share is the share of kills that found the outbox neither full nor empty, and
   crash_inside_flush_share adds those that hit the first batch's open transaction.
2. Dedup (tests/billing_load.py): 32 client threads send 100,000 events (5,000 with --quick), 10%
   exact duplicates among them and 5% replayed "days later", through ingest_usage in batches of 500
   while 4 relay threads post the outbox. dedup_mismatch counts ledger keys whose milliseconds differ
   from the ground truth (missing, extra or different), plus the difference in usage records, rows
   left in the outbox and client errors; dedup_invoice_mismatch_cents compares the finalized invoices
   with the truth rated by billing.rating.
3. Ingest rate on PostgreSQL, one connection: ingest_per_s_batched with 1,000 events per ingest_usage
   call (one transaction each; 50,000 events, 3,000 with --quick), ingest_per_s_single with one event
   per call (5,000 events, 200 with --quick).
4. Invoicing: 1,000 tenants with 1,000,000 usage records in October 2026 (3,000 with --quick, in
   invoice_records), bulk-loaded with COPY together with their outbox rows (load_s), posted to the
   ledger by two `manage.py relay_usage` processes (in this process with --quick; relay_s), then
   invoice_1000_tenants_s: run_invoices(2026-10) drafting every tenant's invoice (invoice_draft_s),
   then run_invoices(finalize=True) (invoice_finalize_s). With --quick only the finalizing pass runs
   (it creates and finalizes each invoice; invoice_draft_s is null), to stay under a minute.
5. Concurrent invoices: 20 runs (drafts and finalizations mixed, released together by a barrier) for
   one tenant and period: concurrent_invoice_runs, and invoices_created (there must be 1).

The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

DB_NAME = "polychip_bench_billing"
POSTGRES = os.environ.get("POLYCHIP_BENCH_POSTGRES", "postgres://postgres@127.0.0.1:5432").rstrip("/")
REDIS = os.environ.get("POLYCHIP_BENCH_REDIS", "redis://127.0.0.1:6379/13")

INVOICE_PERIOD = date(2026, 10, 1)
INVOICE_NOW = datetime(2026, 11, 5, tzinfo=UTC)  # ingest's lateness check and finalization: after October
FLAVORS = ("h100-sxm", "a100-sxm", "ascend-910b", "tpu-v4", "mi300x")  # mi300x: the standard per-NAU price


def say(text: str) -> None:
    print(text, flush=True)


def _admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(f"{POSTGRES}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def create_database(scratch: Path) -> None:
    """The scratch database and Redis db, and Django set up against them."""
    import redis

    _admin(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    _admin(f"CREATE DATABASE {DB_NAME}")
    redis.Redis.from_url(REDIS).flushdb()
    os.environ.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        DATABASE_URL=f"{POSTGRES}/{DB_NAME}",
        CELERY_BROKER_URL=REDIS,
        POLYCHIP_VAR_DIR=str(scratch / "var"),
    )
    os.environ.pop("CHANNEL_REDIS_URL", None)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def drop_database() -> None:
    import redis
    from django.db import connections

    connections.close_all()
    _admin(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
    redis.Redis.from_url(REDIS).flushdb()


# --- 1. crash trials ------------------------------------------------------------------------------


def crash_figures(trials: int, scratch: Path, *, quick: bool) -> dict[str, Any]:
    from django.db import connection

    from tests.billing_crash import CrashTrials, database_url, delete_usage

    with CrashTrials(database_url(connection.settings_dict), scratch / "crash", records=800, log=say) as harness:
        harness.calibrate(1 if quick else 3)
        summary = harness.run(trials, every=max(1, trials // 10))
    delete_usage(harness.tenant_ids)  # the trials keep their rows; the figures below start clean
    for problem in summary["problems"]:
        say(f"  problem: {problem}")
    return {
        "crash_trials": summary["crash_trials"],
        "ledger_mismatch_cents": summary["ledger_mismatch_cents"],
        "lost_records": summary["lost_records"],
        "double_counted_records": summary["double_counted_records"],
        "crash_by_kind": summary["by_kind"],
        "crash_records_per_trial": summary["records_per_trial"],
        "crash_mid_flush_share": summary["mid_flush_share"],
        "crash_in_transaction_share": summary["in_transaction_share"],
        "crash_inside_flush_share": summary["inside_flush_share"],
        "crash_redelivered_after_child_kill": (
            f"{summary['redelivered_after_child_kill']}/{summary['child_kills_under_task']}"
        ),
        "crash_expected_flush_s": summary["expected_flush_s"],
        "crash_trial_s_median": summary["trial_s_median"],
        "crash_trials_with_problems": summary["trials_with_problems"],
        "crash_wall_s": summary["wall_s"],
    }


# --- 2. dedup -------------------------------------------------------------------------------------


def dedup_figures(events: int) -> dict[str, Any]:
    from billing import services
    from tests import billing_load as load

    tenant_ids = load.setup_tenants(32, prefix="bench-load")
    plan = load.make_events(events, seed=8, tenant_ids=tenant_ids)
    first, later = load.send_plan(plan, clients=32, batch=500, relayers=4)
    services.relay_usage()
    errors = first.errors + later.errors
    for error in errors[:5]:
        say(f"  error: {error}")
    truth = load.ground_truth(plan.unique)
    state = load.ledger_state(tenant_ids)
    keys = truth.keys.keys() | state.keys.keys()
    wrong_keys = sum(1 for key in keys if truth.keys.get(key) != state.keys.get(key))
    invoices = load.finalize_all(tenant_ids)
    cents = sum(
        abs(view.total - (truth.invoices[pair].total if pair in truth.invoices else 0)) * 100
        for pair, view in invoices.items()
    )
    cents += sum(invoice.total * 100 for pair, invoice in truth.invoices.items() if pair not in invoices)
    say(
        f"  {plan.sent} events ({len(plan.unique)} unique) from 32 clients: {first.created + later.created} created, "
        f"{first.duplicates + later.duplicates} duplicates, {wrong_keys} ledger keys off, {len(errors)} errors"
    )
    return {
        "dedup_mismatch": wrong_keys + abs(state.records - truth.records) + state.outbox + len(errors),
        "dedup_events": plan.sent,
        "dedup_unique_events": len(plan.unique),
        "dedup_clients": 32,
        "dedup_conflicts": first.conflicts + later.conflicts,
        "dedup_events_per_s": round(first.events_per_s),
        "dedup_invoice_mismatch_cents": int(cents),
        "dedup_invoices": len(invoices),
    }


# --- 3. ingest rate -------------------------------------------------------------------------------


def _tenants(prefix: str, count: int) -> list[int]:
    from tenants.models import Tenant

    Tenant.objects.bulk_create(
        [Tenant(slug=f"{prefix}-{n}", name=f"{prefix} {n}") for n in range(count)], ignore_conflicts=True
    )
    by_slug = dict(Tenant.objects.filter(slug__startswith=f"{prefix}-").values_list("slug", "pk"))
    return [by_slug[f"{prefix}-{n}"] for n in range(count)]


def _intervals(count: int, tenant_ids: list[int], prefix: str, seed: int) -> list[Any]:
    from billing.contracts import UsageInterval

    rng = random.Random(seed)
    base = datetime(2026, 10, 1, tzinfo=UTC)  # October, so no earlier period is left to invoice first
    out = []
    for n in range(count):
        start = base + timedelta(seconds=rng.uniform(0, 29 * 86_400))
        out.append(
            UsageInterval(
                key=f"{prefix}-{n}",
                tenant_id=rng.choice(tenant_ids),
                job_id=rng.randrange(1, 11),
                device_id=f"dev-{rng.randrange(64)}",
                flavor=rng.choice(FLAVORS),
                started_at=start,
                ended_at=start + timedelta(seconds=rng.uniform(0.001, 2 * 86_400)),
                nau_milli=rng.randrange(250, 4000),
            )
        )
    return out


def ingest_figures(batched: int, single: int) -> dict[str, Any]:
    from billing import services
    from tests.billing_crash import delete_usage

    tenant_ids = _tenants("bench-ingest", 10)
    events = _intervals(batched, tenant_ids, "ingest-batched", seed=3)
    began = time.perf_counter()
    for start in range(0, len(events), 1000):
        services.ingest_usage(events[start : start + 1000], now=INVOICE_NOW)
    batched_rate = len(events) / (time.perf_counter() - began)
    events = _intervals(single, tenant_ids, "ingest-single", seed=4)
    began = time.perf_counter()
    for event in events:
        services.ingest_usage([event], now=INVOICE_NOW)
    single_rate = len(events) / (time.perf_counter() - began)
    delete_usage(tenant_ids)
    say(f"  batched {batched_rate:.0f}/s ({batched} events), single {single_rate:.0f}/s ({single} events)")
    return {
        "ingest_per_s_batched": round(batched_rate),
        "ingest_per_s_single": round(single_rate),
        "ingest_events_batched": batched,
        "ingest_events_single": single,
    }


# --- 4. invoicing 1,000 tenants -------------------------------------------------------------------


def _copy_usage(records: int, tenant_ids: list[int]) -> None:
    """COPY the usage records in (keys, durations and splits as ingest would write them), then one outbox
    row each, as ingest_usage would have written them (but in one statement)."""
    from django.db import connection, transaction

    from billing import rating
    from billing.models import UsageOutbox, UsageRecord

    rng = random.Random(5)
    lo = rating.epoch_ms(datetime(2026, 10, 1, tzinfo=UTC))  # October; some run on into November
    hi = rating.epoch_ms(datetime(2026, 10, 31, tzinfo=UTC))
    now = datetime.now(UTC)
    table, outbox = UsageRecord._meta.db_table, UsageOutbox._meta.db_table
    columns = "key, tenant_id, job_id, device_id, flavor, started_at, ended_at, duration_ms, nau_milli, recorded_at"
    with transaction.atomic(), connection.cursor() as cursor:
        with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            buffer = io.StringIO()
            for n in range(records):
                start = rng.randrange(lo, hi)
                held = rng.randrange(1, 2 * 86_400_000)
                buffer.write(
                    f"inv-{n}\t{tenant_ids[n % len(tenant_ids)]}\t{rng.randrange(1, 11)}\tdev-{rng.randrange(64)}\t"
                    f"{rng.choice(FLAVORS)}\t{rating.from_epoch_ms(start).isoformat()}\t"
                    f"{rating.from_epoch_ms(start + held).isoformat()}\t{held}\t{rng.randrange(250, 4000)}\t"
                    f"{now.isoformat()}\n"
                )
                if n % 20_000 == 19_999:
                    copy.write(buffer.getvalue())
                    buffer = io.StringIO()
            copy.write(buffer.getvalue())
        cursor.execute(
            f"INSERT INTO {outbox} (record_id, created_at) SELECT id, %s FROM {table} "
            "WHERE tenant_id = ANY(%s) ORDER BY id",
            [now, tenant_ids],
        )


def _relay_processes(count: int) -> None:
    """``count`` standalone relays (manage.py relay_usage, no --loop: each exits when the outbox is empty)."""
    relays = [
        subprocess.Popen(
            [sys.executable, "manage.py", "relay_usage", "--batch", "2000"],
            cwd=ROOT,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for _ in range(count)
    ]
    for relay in relays:
        output, _ = relay.communicate()
        if relay.returncode:
            raise SystemExit(f"bench: manage.py relay_usage failed: {output[-2000:]}")


def invoice_figures(records: int, *, relay_processes: int, draft_first: bool) -> dict[str, Any]:
    from django.db.models import Count, Q, Sum

    from billing import services
    from billing.models import Invoice, LedgerEntry, UsageRecord

    tenant_ids = _tenants("bench-invoice", 1000)
    services.default_price_book()
    began = time.perf_counter()
    _copy_usage(records, tenant_ids)
    load_s = time.perf_counter() - began
    say(f"  {records} usage records and their outbox rows loaded in {load_s:.1f} s; relaying")
    began = time.perf_counter()
    if relay_processes:
        _relay_processes(relay_processes)
    services.relay_usage(batch=2000)  # (what a relay skipped, locked by the other, at the very end)
    relay_s = time.perf_counter() - began
    entries = LedgerEntry.objects.filter(tenant_id__in=tenant_ids)
    say(f"  relayed in {relay_s:.1f} s ({entries.count()} ledger entries); invoicing 1,000 tenants")
    draft_s = None
    if draft_first:
        began = time.perf_counter()
        drafts = services.run_invoices(INVOICE_PERIOD, finalize=False, now=INVOICE_NOW, tenant_ids=tenant_ids)
        draft_s = time.perf_counter() - began
        say(f"  {len(drafts)} drafts in {draft_s:.1f} s; finalizing them")
    began = time.perf_counter()
    views = services.run_invoices(INVOICE_PERIOD, finalize=True, now=INVOICE_NOW, tenant_ids=tenant_ids)
    finalize_s = time.perf_counter() - began
    billed = entries.filter(period__lte=INVOICE_PERIOD).aggregate(
        unbilled=Sum("duration_ms", filter=Q(invoice__isnull=True)), total=Sum("duration_ms")
    )
    invoices = Invoice.objects.filter(tenant_id__in=tenant_ids)
    lines = invoices.aggregate(n=Count("lines"))
    recorded = UsageRecord.objects.filter(tenant_id__in=tenant_ids).aggregate(ms=Sum("duration_ms"))["ms"]
    ledger_ms = entries.aggregate(ms=Sum("duration_ms"))["ms"]
    say(f"  {len(views)} invoices finalized in {finalize_s:.1f} s ({lines['n']} lines)")
    return {
        "invoice_1000_tenants_s": round((draft_s or 0.0) + finalize_s, 2),
        "invoice_draft_s": None if draft_s is None else round(draft_s, 2),
        "invoice_finalize_s": round(finalize_s, 2),
        "invoice_tenants": len({v.tenant_id for v in views}),
        "invoices_finalized": invoices.filter(status="finalized").count(),
        "invoice_records": records,
        "invoice_ledger_entries": entries.count(),
        "invoice_lines": lines["n"],
        "invoice_unbilled_ms": int(billed["unbilled"] or 0),
        "invoice_ledger_ms_equals_records": ledger_ms == recorded,
        "load_s": round(load_s, 2),
        "relay_s": round(relay_s, 2),
        "relay_records_per_s": round(records / relay_s),
    }


# --- 5. concurrent invoice runs -------------------------------------------------------------------


def race_figures(runs: int) -> dict[str, Any]:
    from billing import services
    from tests import billing_load as load

    tenant_ids = _tenants("bench-race", 1)
    services.ingest_usage(_intervals(200, tenant_ids, "race", seed=6), now=INVOICE_NOW)
    services.relay_usage()
    result = load.concurrent_invoice_runs(tenant_ids[0], INVOICE_PERIOD, runs, now=INVOICE_NOW, seed=7)
    say(f"  {runs} concurrent runs answered invoice(s) {sorted(result.ids_seen)}; {result.invoices_created} exist")
    return {"concurrent_invoice_runs": runs, "invoices_created": result.invoices_created}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small version (see above), under a minute")
    parser.add_argument("--trials", type=int, default=None, help="crash trials (default 200, 5 with --quick)")
    args = parser.parse_args()
    trials = args.trials if args.trials is not None else (5 if args.quick else 200)
    figures: dict[str, Any] = {"quick": args.quick}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="polychip-bench-billing-") as tmp:
        scratch = Path(tmp)
        say(f"scratch database {DB_NAME}, broker {REDIS}")
        create_database(scratch)
        say(f"  created and migrated in {time.perf_counter() - started:.1f} s")
        try:
            quick = args.quick
            sections: list[tuple[str, Any]] = [
                (f"crash trials ({trials})", lambda: crash_figures(trials, scratch, quick=quick)),
                ("dedup", lambda: dedup_figures(5_000 if quick else 100_000)),
                ("ingest rate", lambda: ingest_figures(*((3_000, 200) if quick else (50_000, 5_000)))),
                (
                    "invoicing 1,000 tenants",
                    lambda: invoice_figures(
                        3_000 if quick else 1_000_000, relay_processes=0 if quick else 2, draft_first=not quick
                    ),
                ),
                ("concurrent invoice runs", lambda: race_figures(20)),
            ]
            for name, measure in sections:
                say(f"{name}:")
                began = time.perf_counter()
                figures |= measure()
                say(f"  ({time.perf_counter() - began:.1f} s)")
        finally:
            drop_database()
    figures["wall_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
