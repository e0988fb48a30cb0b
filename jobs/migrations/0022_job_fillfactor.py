"""Leave room on each page of the jobs table for a row's next version (PostgreSQL's fillfactor).

A job's row is rewritten far more often than it is inserted: its reason at every admission cycle
while it waits (8,500 of them in one cycle at 10,000 queued jobs), its progress while it runs. With
full pages each new version lands on another page, and every one of the table's eight indexes gets an
entry for it. With room left on the page, a change to columns no index covers is a heap-only tuple
(HOT) update: no index is touched. Half of each page is left free, so that every row of a page can
take its next version there: a cycle rewrites the reasons of nearly every waiting job at once.
Measured on the admission bench's 10,000-job cycle, writing 8,471 reasons took 0.33-0.43 s at
fillfactor 100, 0.22-0.37 s at 70 and 0.07-0.12 s at 50. The table takes twice the pages it would.

Pages already written keep what they hold until they are rewritten (VACUUM FULL, pg_repack); new
pages follow the setting. SQLite has no such setting.
"""

from django.db import migrations

FILLFACTOR = 50


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
