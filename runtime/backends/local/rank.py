"""Rank launcher: ``python -m runtime.backends.local.rank --config rankN.json --speed S``.

Runs the worker in this process with a step hook that emulates a device of relative speed S
(see ``runtime.backends.local.emulation``) and, with ``--device-id``, the device's health readings
(``runtime.backends.local.health``); exit codes are the worker's.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from runtime.backends.local.emulation import SpeedSource, make_padding_hook
from runtime.backends.local.health import EmulatedDeviceProbe
from runtime.worker.cli import exit_process, run_config_file


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.backends.local.rank")
    parser.add_argument("--config", required=True, help="the rank's worker config (JSON)")
    parser.add_argument("--speed", type=float, required=True, help="relative speed, 1.0 = reference chip")
    parser.add_argument("--sample-time-ms", type=float, default=0.5, help="emulated time per sample at speed 1.0")
    parser.add_argument("--speed-file", default=None, help="file whose float content overrides --speed live")
    parser.add_argument("--device-id", default=None, help="the emulated device (seeds its health readings)")
    parser.add_argument("--health-file", default=None, help="file that injects a slow degradation when it appears")
    parser.add_argument("--minutes-per-second", type=float, default=1.0, help="emulated health minutes per second")
    args = parser.parse_args(argv)
    try:
        speed = SpeedSource(args.speed, Path(args.speed_file) if args.speed_file else None)
        hook = make_padding_hook(args.sample_time_ms, speed)
        probe = (
            EmulatedDeviceProbe(
                args.device_id, args.minutes_per_second, Path(args.health_file) if args.health_file else None
            )
            if args.device_id
            else None
        )
    except ValueError as exc:
        print(f"local rank launcher: {exc}", file=sys.stderr, flush=True)  # noqa: T201 (a CLI's error)
        return 2
    return run_config_file(args.config, [hook], probe)


if __name__ == "__main__":
    exit_process(main())
