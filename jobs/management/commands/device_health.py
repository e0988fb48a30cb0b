"""``manage.py device_health``: the operator's device actions from a shell.

    manage.py device_health --set healthy gpu-h100-0/0 gpu-h100-0/1   # return devices (or cordon, fail, ...)
    manage.py device_health --return-failed                           # every device marked failed -> healthy
    manage.py device_health --drain-node gpu-h100-0                   # cordon a node; its jobs checkpoint and move

The same services as the admin console's actions.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs import services
from jobs.models import Device, DeviceHealth


class Command(BaseCommand):
    help = "Set devices' health, return failed devices, or drain a node (its jobs checkpoint, then move)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("device_ids", nargs="*")
        parser.add_argument("--set", choices=DeviceHealth.values, help="the health to give the devices named")
        parser.add_argument("--return-failed", action="store_true", help="mark every failed device healthy")
        parser.add_argument("--drain-node", metavar="NODE", help="cordon the node and move its jobs")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            if options["drain_node"]:
                moved = services.drain_node(options["drain_node"], by="device_health command")
                self.stdout.write(f"node {options['drain_node']} cordoned; {len(moved)} job(s) asked to move: {moved}")
            if options["return_failed"]:
                failed = list(Device.objects.filter(health=DeviceHealth.FAILED).values_list("device_id", flat=True))
                changed = services.set_device_health(failed, DeviceHealth.HEALTHY, by="device_health command")
                self.stdout.write(f"{changed} failed device(s) returned")
            if options["set"]:
                if not options["device_ids"]:
                    raise CommandError("name the devices to set, e.g. gpu-h100-0/0")
                changed = services.set_device_health(options["device_ids"], options["set"], by="device_health command")
                self.stdout.write(f"{changed} device(s) now {options['set']}")
        except services.UnknownDevices as exc:
            raise CommandError(str(exc)) from None
