from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser


class Command(BaseCommand):
    help = "Create the cloud operator account (a superuser for the admin console) if it is missing."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="operator")
        parser.add_argument("--password", required=True)

    def handle(self, *args: Any, **options: Any) -> None:
        users = get_user_model()
        if users.objects.filter(username=options["username"]).exists():
            return
        users.objects.create_superuser(username=options["username"], email="", password=options["password"])
        self.stdout.write(f"operator {options['username']} created")
