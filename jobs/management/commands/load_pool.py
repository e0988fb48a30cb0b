from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs import services
from runtime.inventory import PoolFileError, load_pool


class Command(BaseCommand):
    help = "Load (or refresh) flavors, nodes and devices from a pool file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--file", default=settings.POLYCHIP_POOL_FILE, help="pool YAML (default: POLYCHIP_POOL_FILE)"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            pool = load_pool(options["file"])
        except (OSError, PoolFileError) as exc:
            raise CommandError(str(exc)) from None
        count = services.sync_pool(pool)
        self.stdout.write(f"pool: {len(pool.flavors)} flavors, {len(pool.nodes)} nodes, {count} devices")
