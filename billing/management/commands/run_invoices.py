"""``manage.py run_invoices``: draft or bill a period's invoices from a shell (or cron).

    manage.py run_invoices --period 2026-11                  # draft every tenant's invoice for November
    manage.py run_invoices --period 2026-11 --finalize       # bill it: the invoices freeze
    manage.py run_invoices --period 2026-11 --tenant acme    # one tenant only

The outbox is posted to the ledger first, so usage ingested so far is on the invoices. Safe to run
again, and concurrently: a draft is refreshed, a finalized invoice is left as it is.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing import rating, services
from billing.api.serializers import money
from billing.contracts import InvoiceView
from tenants import services as tenants


class Command(BaseCommand):
    help = "Draft (or with --finalize, bill) a period's invoices, one line per invoice."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--period", required=True, help="the month to invoice, as YYYY-MM")
        parser.add_argument("--finalize", action="store_true", help="bill the period: finalized invoices are frozen")
        parser.add_argument("--tenant", metavar="SLUG", help="only this tenant")

    def handle(self, *args: Any, **options: Any) -> None:
        finalize: bool = options["finalize"]
        try:
            period = services.parse_period(options["period"])
            tenant_ids = [self._tenant_id(options["tenant"])] if options["tenant"] else None
            invoices = services.run_invoices(period, finalize=finalize, tenant_ids=tenant_ids)
        except (services.BillingError, rating.RatingError) as exc:
            raise CommandError(str(exc)) from None
        for invoice in invoices:
            self.stdout.write(self._line(invoice))
        action = "finalized" if finalize else "drafted"
        self.stdout.write(f"{len(invoices)} invoice(s) {action} for {period:%Y-%m}")

    @staticmethod
    def _tenant_id(slug: str) -> int:
        tenant_id = tenants.tenant_id_for_slug(slug)
        if tenant_id is None:
            raise CommandError(f"no tenant {slug!r}: give a tenant's slug (manage.py shell lists them)")
        return tenant_id

    @staticmethod
    def _line(invoice: InvoiceView) -> str:
        return (
            f"{invoice.number}  {invoice.tenant_slug:<20} {invoice.status:<9} "
            f"{invoice.currency} {money(invoice.total):>14}  {len(invoice.lines)} line(s)"
        )
