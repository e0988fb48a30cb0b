from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from tenants import services
from tenants.models import NAU_RESOURCE
from tenants.quota_rules import QuotaSpec


class Command(BaseCommand):
    help = "Create a tenant with a user (if missing) and issue an API token, written to a file."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--slug", default="demo")
        parser.add_argument("--name", default="Demo Lab")
        parser.add_argument("--user", default="demo")
        parser.add_argument("--password", default="demo-password")
        parser.add_argument("--token-file", required=True, help="where to write the new token (mode 0600)")
        parser.add_argument(
            "--nau-quota",
            type=Decimal,
            default=None,
            help="give the tenant this NAU quota when it has no quota yet (operators change it later)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = services.ensure_tenant_with_user(
            slug=options["slug"], name=options["name"], username=options["user"], password=options["password"]
        )
        if options["nau_quota"] is not None and not services.get_tenant(tenant.id).quotas:
            services.set_quota(tenant.id, QuotaSpec(resource=NAU_RESOURCE, nominal=options["nau_quota"]))
        token = services.issue_token(tenant_id=tenant.id, username=options["user"], name="demo CLI", replace=True)
        path = Path(options["token_file"])
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token.secret + "\n")
        self.stdout.write(f"tenant {tenant.slug}: user {options['user']}, token written to {path}")
