from __future__ import annotations

import secrets
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from tenants import services
from tenants.management.secret_files import write_secret
from tenants.models import NAU_RESOURCE
from tenants.quota_rules import QuotaSpec


class Command(BaseCommand):
    help = (
        "Create a tenant with a user (if missing) and an API token kept in a file (a live one there is kept). "
        "The user's "
        "password is random, written to --password-file (mode 0600); there is no default password."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--slug", default="demo")
        parser.add_argument("--name", default="Demo Lab")
        parser.add_argument("--user", default="demo")
        parser.add_argument("--password-file", required=True, help="where to write the user's new password (0600)")
        parser.add_argument(
            "--token-file",
            required=True,
            help="where the token is kept (mode 0600): a live token already there is kept, else a new one is written",
        )
        parser.add_argument(
            "--demo",
            action="store_true",
            help="mark the user as a demo account: a production-like start refuses to run while one exists",
        )
        parser.add_argument(
            "--nau-quota",
            type=Decimal,
            default=None,
            help="give the tenant this NAU quota when it has no quota yet (operators change it later)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        password_file = Path(options["password_file"])
        if password_file.resolve() == Path(options["token_file"]).resolve():
            raise CommandError("--password-file and --token-file must be different files")
        password = secrets.token_urlsafe(12)
        tenant = services.ensure_tenant_with_user(
            slug=options["slug"],
            name=options["name"],
            username=options["user"],
            password=password,
            demo=options["demo"],
        )
        # A new password each time, so the file always holds the one that works.
        services.set_password(options["user"], password)
        write_secret(password_file, password)
        if options["nau_quota"] is not None and not services.get_tenant(tenant.id).quotas:
            services.set_quota(tenant.id, QuotaSpec(resource=NAU_RESOURCE, nominal=options["nau_quota"]))
        token_file = Path(options["token_file"])
        if _still_works(token_file, tenant_id=tenant.id, username=options["user"]):
            kept = "kept"  # a CI secret made from it keeps working across restarts, until it is revoked
        else:
            token = services.issue_token(tenant_id=tenant.id, username=options["user"], name="demo CLI", replace=True)
            write_secret(token_file, token.secret)
            kept = "written"
        self.stdout.write(
            f"tenant {tenant.slug}: user {options['user']}, password written to {password_file}, "
            f"token {kept} in {token_file}"
        )


def _still_works(token_file: Path, *, tenant_id: int, username: str) -> bool:
    """Whether the file holds a live token of this user in this tenant."""
    try:
        secret = token_file.read_text().strip()
    except OSError:
        return False
    token = services.authenticate_token(secret) if secret else None
    return token is not None and token.tenant_id == tenant_id and token.user.get_username() == username
