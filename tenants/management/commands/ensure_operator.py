from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from tenants import services
from tenants.management.secret_files import write_secret


class Command(BaseCommand):
    help = (
        "Create the cloud operator account (a superuser for the admin console) if it is missing, "
        "with a random password written to a file (mode 0600)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="operator")
        parser.add_argument("--password-file", required=True)
        parser.add_argument(
            "--demo",
            action="store_true",
            help="mark the account as a demo account: a production-like start refuses to run while one exists",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        path = Path(options["password_file"])
        if not (users.objects.filter(username=options["username"]).exists() and path.exists()):
            password = secrets.token_urlsafe(12)
            write_secret(path, password)
            user, _ = users.objects.get_or_create(username=options["username"])
            user.is_staff = user.is_superuser = True
            user.set_password(password)
            user.save()
            self.stdout.write(f"operator {options['username']}: password written to {path}")
        if options["demo"]:
            services.mark_demo_user(options["username"])
