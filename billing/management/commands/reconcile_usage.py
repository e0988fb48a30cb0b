"""``manage.py reconcile_usage``: what allocations held against what billing recorded, per tenant and flavor.

    manage.py reconcile_usage            # a table; the differences listed; exit status 1 if there are any
    manage.py reconcile_usage --relay    # post the usage outbox to the ledger first
    manage.py reconcile_usage --json     # the same as one JSON object

Every closed allocation wrote one usage record in its own transaction, and the relay turns each
record into ledger entries that add up to it; so per (tenant, flavor), allocated = recorded =
ledger + still in the outbox. A row where that fails is a difference: usage lost, counted twice,
or ingested from outside without an allocation.
"""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing import services as billing
from billing.contracts import Reconciliation, ReconciliationRow

COLUMNS = ("tenant", "flavor", "allocated_ms", "recorded_ms", "ledger_ms", "pending_ms", "difference_ms")


def row_json(row: ReconciliationRow) -> dict[str, Any]:
    return {
        "tenant_id": row.tenant_id,
        "tenant": row.tenant_slug,
        "flavor": row.flavor,
        "allocated_ms": row.allocated_ms,
        "recorded_ms": row.recorded_ms,
        "ledger_ms": row.ledger_ms,
        "pending_ms": row.pending_ms,
        "difference_ms": row.difference_ms,
        "unrecorded_ms": row.allocated_ms - row.recorded_ms,
    }


def _cells(row: ReconciliationRow) -> tuple[str, ...]:
    return (
        row.tenant_slug,
        row.flavor,
        *(
            str(value)
            for value in (row.allocated_ms, row.recorded_ms, row.ledger_ms, row.pending_ms, row.difference_ms)
        ),
    )


def table(rows: tuple[ReconciliationRow, ...]) -> list[str]:
    cells = [COLUMNS, *(_cells(row) for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    # Names to the left, figures to the right, so that the milliseconds line up.
    return [
        "  ".join(
            cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in cells
    ]


class Command(BaseCommand):
    help = "Compare closed allocations with usage records and the ledger, per tenant and flavor."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
        parser.add_argument("--relay", action="store_true", help="post the usage outbox to the ledger first")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["relay"]:
            billing.relay_usage()
        result = billing.reconcile(billing.allocated_ms())
        if options["json"]:
            self.stdout.write(json.dumps(self._json(result), indent=2))
        else:
            self._print(result)
        if not result.balanced:
            raise CommandError(f"{len(result.differences)} difference(s) between allocations and billing", returncode=1)

    @staticmethod
    def _json(result: Reconciliation) -> dict[str, Any]:
        return {
            "balanced": result.balanced,
            "rows": [row_json(row) for row in result.rows],
            "differences": [row_json(row) for row in result.differences],
        }

    def _print(self, result: Reconciliation) -> None:
        if not result.rows:
            self.stdout.write("no usage yet: nothing to reconcile")
            return
        for line in table(result.rows):
            self.stdout.write(line)
        if result.balanced:
            self.stdout.write(f"balanced: {len(result.rows)} tenant-flavor row(s), no differences")
            return
        self.stdout.write("")
        self.stdout.write(f"differences ({len(result.differences)}):")
        for row in result.differences:
            parts = []
            if row.recorded_ms != row.allocated_ms:
                parts.append(f"allocations held {row.allocated_ms} ms, usage records {row.recorded_ms} ms")
            if row.difference_ms:
                parts.append(f"ledger and outbox {row.ledger_ms + row.pending_ms} ms ({row.difference_ms:+d} ms)")
            self.stdout.write(f"  {row.tenant_slug} {row.flavor}: {'; '.join(parts)}")
