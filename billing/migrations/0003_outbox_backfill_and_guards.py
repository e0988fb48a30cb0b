"""An outbox row for usage recorded before the ledger existed, and (on
PostgreSQL) triggers that keep finalized invoices and billed ledger entries immutable for every
writer, not only the ORM."""

from django.db import migrations

GUARDS = """
CREATE OR REPLACE FUNCTION billing_invoice_immutable() RETURNS trigger AS $$
BEGIN
    IF OLD.status = 'finalized' THEN
        RAISE EXCEPTION 'invoice % is finalized and cannot change', OLD.id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER billing_invoice_immutable BEFORE UPDATE OR DELETE ON billing_invoice
    FOR EACH ROW EXECUTE FUNCTION billing_invoice_immutable();

CREATE OR REPLACE FUNCTION billing_invoiceline_immutable() RETURNS trigger AS $$
DECLARE
    owner bigint;
BEGIN
    owner := CASE WHEN TG_OP = 'INSERT' THEN NEW.invoice_id ELSE OLD.invoice_id END;
    IF EXISTS (SELECT 1 FROM billing_invoice WHERE id = owner AND status = 'finalized') THEN
        RAISE EXCEPTION 'invoice % is finalized: its lines cannot change', owner USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER billing_invoiceline_immutable BEFORE INSERT OR UPDATE OR DELETE ON billing_invoiceline
    FOR EACH ROW EXECUTE FUNCTION billing_invoiceline_immutable();

CREATE OR REPLACE FUNCTION billing_ledgerentry_refuse() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'ledger entry % is billed and cannot be deleted', OLD.key USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RAISE EXCEPTION 'ledger entry % is immutable: only an invoice may claim it, once', OLD.key USING ERRCODE = 'integrity_constraint_violation';
END $$ LANGUAGE plpgsql;
-- WHEN clauses, so that an invoice claiming thousands of entries calls no function per row.
CREATE TRIGGER billing_ledgerentry_update BEFORE UPDATE ON billing_ledgerentry FOR EACH ROW
    WHEN (OLD.invoice_id IS NOT NULL
          OR (NEW.key, NEW.record_id, NEW.tenant_id, NEW.job_id, NEW.flavor, NEW.period, NEW.start_ms, NEW.duration_ms, NEW.nau_milli)
             IS DISTINCT FROM
             (OLD.key, OLD.record_id, OLD.tenant_id, OLD.job_id, OLD.flavor, OLD.period, OLD.start_ms, OLD.duration_ms, OLD.nau_milli))
    EXECUTE FUNCTION billing_ledgerentry_refuse();
CREATE TRIGGER billing_ledgerentry_delete BEFORE DELETE ON billing_ledgerentry FOR EACH ROW
    WHEN (OLD.invoice_id IS NOT NULL)
    EXECUTE FUNCTION billing_ledgerentry_refuse();
"""

UNGUARD = """
DROP TRIGGER IF EXISTS billing_invoice_immutable ON billing_invoice;
DROP TRIGGER IF EXISTS billing_invoiceline_immutable ON billing_invoiceline;
DROP TRIGGER IF EXISTS billing_ledgerentry_update ON billing_ledgerentry;
DROP TRIGGER IF EXISTS billing_ledgerentry_delete ON billing_ledgerentry;
DROP FUNCTION IF EXISTS billing_invoice_immutable();
DROP FUNCTION IF EXISTS billing_invoiceline_immutable();
DROP FUNCTION IF EXISTS billing_ledgerentry_refuse();
"""


def outbox_for_earlier_usage(apps, schema_editor):
    UsageRecord = apps.get_model("billing", "UsageRecord")
    UsageOutbox = apps.get_model("billing", "UsageOutbox")
    UsageOutbox.objects.bulk_create(
        [UsageOutbox(record_id=pk) for pk in UsageRecord.objects.values_list("pk", flat=True)], batch_size=1000
    )


def guards(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        with schema_editor.connection.cursor() as cursor:
            cursor.execute(GUARDS)  # no parameters: the RAISE formats keep their '%'



def unguard(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(UNGUARD)


class Migration(migrations.Migration):
    dependencies = [("billing", "0002_ledger_invoices_budgets")]

    operations = [
        migrations.RunPython(outbox_for_earlier_usage, migrations.RunPython.noop),
        migrations.RunPython(guards, unguard),
    ]
