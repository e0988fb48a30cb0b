"""Drop the jobs table's indexes that others cover: state alone (and, on PostgreSQL, its LIKE twin, for
a column never matched by pattern) and tenant alone. (state, created_at) and (tenant, ...) lead with each,
and serve the same lookups. Every index costs each new version of a job's row an entry: a claim that
moves 1,529 jobs took 0.097-0.109 s with the eight indexes and 0.073-0.083 s with the five left.

Only the indexes go, and on PostgreSQL without locking the table (DROP INDEX CONCURRENTLY, outside a
transaction): Django's own AlterField would also drop the tenant foreign key and add it back, checking
every job while it holds the jobs and tenants tables.
"""

from django.db import migrations, models
import django.db.models.deletion

# Django's names for them, as migration 0001 created them.
INDEXES = {
    "jobs_trainingjob_state_e275396b": "(state)",
    "jobs_trainingjob_state_e275396b_like": "(state varchar_pattern_ops)",
    "jobs_trainingjob_tenant_id_081000e1": "(tenant_id)",
}


def drop_indexes(apps, schema_editor) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    for name in INDEXES:
        schema_editor.execute(f"DROP INDEX {'CONCURRENTLY ' if postgres else ''}IF EXISTS {schema_editor.quote_name(name)}")


def create_indexes(apps, schema_editor) -> None:
    postgres = schema_editor.connection.vendor == "postgresql"
    for name, columns in INDEXES.items():
        if not postgres and "varchar_pattern_ops" in columns:
            continue  # PostgreSQL's alone
        schema_editor.execute(
            f"CREATE INDEX {'CONCURRENTLY ' if postgres else ''}IF NOT EXISTS {schema_editor.quote_name(name)} "
            f"ON {schema_editor.quote_name('jobs_trainingjob')} {columns}"
        )


class Migration(migrations.Migration):
    atomic = False  # DROP INDEX CONCURRENTLY runs outside a transaction

    dependencies = [
        ("jobs", "0022_job_fillfactor"),
        ("tenants", "0004_idempotencykey"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="trainingjob",
                    name="state",
                    field=models.CharField(
                        choices=[
                            ("queued", "Queued"),
                            ("admitted", "Admitted"),
                            ("running", "Running"),
                            ("recovering", "Recovering"),
                            ("succeeded", "Succeeded"),
                            ("failed", "Failed"),
                            ("cancelled", "Cancelled"),
                        ],
                        default="queued",
                        max_length=16,
                    ),
                ),
                migrations.AlterField(
                    model_name="trainingjob",
                    name="tenant",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="jobs",
                        to="tenants.tenant",
                    ),
                ),
            ],
            database_operations=[migrations.RunPython(drop_indexes, create_indexes)],
        ),
    ]
