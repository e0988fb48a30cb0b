"""``manage.py relay_usage``: post the usage outbox to the ledger from a shell.

    manage.py relay_usage                          # post everything waiting, print how many rows, exit
    manage.py relay_usage --loop                   # keep posting as usage arrives (a standalone relay)
    manage.py relay_usage --loop --batch 200 --interval-ms 500

The same service as the Celery task that beat runs every few seconds (billing.services.relay_usage):
each batch claims outbox rows with ``FOR UPDATE SKIP LOCKED``, writes their keyed ledger entries and
deletes them in one transaction, so any number of relays (these and Celery's) can run at once, and
one killed at any instant leaves nothing lost or posted twice. With ``--loop`` a lost database
connection (a restart, a failover, an administrator's ``pg_terminate_backend``) is logged and the
relay reconnects on its next round; SIGTERM or Ctrl-C stops it after the batch in hand.
"""

from __future__ import annotations

import contextlib
import signal
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection

from billing import services


class Command(BaseCommand):
    help = "Post the usage outbox to the ledger; with --loop, keep doing so as usage arrives."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--loop", action="store_true", help="keep relaying until stopped (SIGTERM or Ctrl-C)")
        parser.add_argument("--batch", type=int, default=500, help="outbox rows per transaction (default 500)")
        parser.add_argument(
            "--interval-ms",
            type=int,
            default=1000,
            help="with --loop, milliseconds to wait when the outbox is empty or the database is away (default 1000)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        batch, interval_ms = options["batch"], options["interval_ms"]
        if batch < 1:
            raise CommandError(f"--batch {batch}: give at least 1 outbox row per transaction")
        if interval_ms < 0:
            raise CommandError(f"--interval-ms {interval_ms}: give a number of milliseconds, 0 or more")
        if not options["loop"]:
            try:
                posted = services.relay_usage(batch=batch)
            except DatabaseError as exc:
                raise CommandError(f"relaying failed, nothing half-posted: {exc}") from exc
            self.stdout.write(f"posted {posted} outbox row(s) to the ledger")
            return
        self._loop(batch, interval_ms)

    def _loop(self, batch: int, interval_ms: int) -> None:
        stopping = False

        def stop(signum: int, frame: Any) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        total = 0
        self.stdout.write(f"relaying the usage outbox in batches of {batch}; idle polls every {interval_ms} ms")
        self.stdout.flush()
        while not stopping:
            try:
                posted = services.post_outbox_batch(batch)
            except DatabaseError as exc:
                # The batch's transaction died with the connection: nothing of it was posted. Drop
                # the connection; the next round opens a fresh one.
                self.stderr.write(f"relay: database error, retrying in {interval_ms} ms: {exc}".rstrip())
                with contextlib.suppress(DatabaseError):
                    connection.close()
                time.sleep(interval_ms / 1000)
                continue
            if posted:
                total += posted
                self.stdout.write(f"posted {posted} outbox row(s) ({total} in all)")
                self.stdout.flush()
            if posted < batch:
                time.sleep(interval_ms / 1000)
        self.stdout.write(f"stopped; posted {total} outbox row(s) to the ledger")
