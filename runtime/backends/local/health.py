"""Emulated device health for the local backend: readings, an injectable slow degradation, a death.

Each rank process reads its emulated device through ``EmulatedDeviceProbe``, which the worker calls
with every heartbeat; the rows it returns (one per emulated minute, ``runtime.recovery.health``'s
features) go to the control plane, whose failure predictor watches them. Time is compressed:
``minutes_per_second`` emulated minutes pass per real second, so a 30-minute degradation plays out
in seconds.

A degradation is injected by writing ``RUN_DIR/health.rank<N>`` (``LocalBackend.inject_degradation``):
``{"mode": "ecc", "minutes_to_failure": 40}``. The probe starts it the first time it sees the file;
when the emulated failure time comes, the rank process kills itself with SIGKILL, as a device that
dies takes its process with it. Only the local backend knows about any of this.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import zlib
from pathlib import Path

from runtime.recovery.health import DeviceTelemetrySource


class EmulatedDeviceProbe:
    def __init__(self, device_id: str, minutes_per_second: float, health_file: Path | None) -> None:
        # One device, one stream of readings: the seed comes from the device's id.
        self.source = DeviceTelemetrySource(zlib.crc32(device_id.encode()), minutes_per_second=minutes_per_second)
        self.health_file = health_file
        self.reported = -1  # the last minute already reported
        self.degrading = False

    def __call__(self) -> list[list[float]]:
        now = time.time()
        self._maybe_start_degradation(now)
        if self.source.failed(now):
            print("local device emulation: the emulated device failed", file=sys.stderr, flush=True)  # noqa: T201
            os.kill(os.getpid(), signal.SIGKILL)
        current = int(self.source.minute_at(now))
        fresh = current - self.reported
        self.reported = current
        return [list(row) for row in self.source.window(now, fresh)] if fresh > 0 else []

    def _maybe_start_degradation(self, now: float) -> None:
        if self.degrading or self.health_file is None or not self.health_file.exists():
            return
        try:
            order = json.loads(self.health_file.read_text())
            mode, minutes = str(order["mode"]), float(order["minutes_to_failure"])
            self.source.start_degradation(mode, minutes, now)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # T201: the rank's stderr is its log, which the supervisor shows when the rank fails.
            print(f"local device emulation: ignoring {self.health_file}: {exc!r}", file=sys.stderr, flush=True)  # noqa: T201
        self.degrading = True
