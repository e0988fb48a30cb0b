"""Leave room on each page of the jobs table for a row's next version (PostgreSQL's fillfactor).

A job's row is rewritten far more often than it is inserted: its reason at every admission cycle
while it waits (8,500 of them in one cycle at 10,000 queued jobs), its progress while it runs. With
full pages each new version lands on another page, and every one of the table's indexes gets an
entry for it. With room left on the page, a change to columns no index covers is a heap-only tuple
(HOT) update: no index is touched. 60% of each page is left free, so that every row of a page can
take its next version there, a reason longer than the one before included: a cycle rewrites the
reasons of nearly every waiting job at once. Writing the 8,452 reasons of the admission bench's first
10,000-job cycle took 0.45 s at fillfactor 100 (18 of 11,333 updates heap-only), 0.24 s at 50 (7,027),
0.14 s at 40 and 0.10 s at 30 (9,804: every reason). The table takes 2.5 times the pages it would; the
jobs that ended, never written again, keep that room.

Pages already written keep what they hold until they are rewritten (VACUUM FULL, pg_repack); new
pages follow the setting. SQLite has no such setting.
"""

from django.db import migrations

FILLFACTOR = 40


def set_fillfactor(apps, schema_editor, value: int | None = FILLFACTOR) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    table = schema_editor.quote_name(apps.get_model("jobs", "TrainingJob")._meta.db_table)
    if value is None:
        schema_editor.execute(f"ALTER TABLE {table} RESET (fillfactor)")
    else:
        schema_editor.execute(f"ALTER TABLE {table} SET (fillfactor = {int(value)})")


def reset_fillfactor(apps, schema_editor) -> None:
    set_fillfactor(apps, schema_editor, None)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0021_attempt_resize_flavors"),
    ]

    operations = [
        migrations.RunPython(set_fillfactor, reset_fillfactor),
    ]
