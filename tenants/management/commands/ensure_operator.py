from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = (
        "Create the cloud operator account (a superuser for the admin console) if it is missing, "
        "with a random password written to a file (mode 0600)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="operator")
        parser.add_argument("--password-file", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        path = Path(options["password_file"])
        if users.objects.filter(username=options["username"]).exists() and path.exists():
            return
        password = secrets.token_urlsafe(12)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(password + "\n")
        user, _ = users.objects.get_or_create(username=options["username"])
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        self.stdout.write(f"operator {options['username']}: password written to {path}")
