"""Command line of the worker: ``python -m runtime.worker --config PATH``.

Exit codes: 0 trained to the end; 1 training failed; 2 the config is unusable; 3 a peer rank was lost
(a collective failed because another rank died: a victim, not the cause); 4 stopped on request after a
full checkpoint (a drain or a preemption: not a failure); 143 terminated by SIGTERM.
The last line on stderr of a failed worker says why, for whoever shows the tail.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from runtime.worker.config import ConfigError, DeviceProbe, StepHook, load_config

EXIT_FAILED = 1
EXIT_BAD_CONFIG = 2
EXIT_PEER_LOST = 3
EXIT_STOPPED = 4
EXIT_TERMINATED = 143

# What gloo says when the other end of a collective went away.
_PEER_LOST_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote worker",
    "econnreset",
)


def is_peer_lost(exc: BaseException) -> bool:
    text = str(exc).lower()
    return any(marker in text for marker in _PEER_LOST_MARKERS)


class Terminated(Exception):
    """SIGTERM arrived; raised in the training thread so telemetry is flushed on the way out."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise Terminated(f"terminated by signal {signum}")


def run_config_file(
    path: str | Path, step_hooks: Sequence[StepHook] = (), device_probe: DeviceProbe | None = None
) -> int:
    """Load the config at ``path``, train, and return the process exit code."""
    try:
        config = load_config(path)
    except (OSError, ConfigError) as exc:
        print(f"polychip worker: unusable config {path}: {exc}", file=sys.stderr, flush=True)
        return EXIT_BAD_CONFIG
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    prefix = f"polychip worker {config.job_id} rank {config.rank}"
    # Imported here so that a bad config is reported without paying for torch's import.
    from runtime.worker.checkpointing import Stopped
    from runtime.worker.train import run

    try:
        result = run(config, step_hooks, device_probe)
    except Stopped as exc:
        print(f"{prefix}: {exc}", file=sys.stderr, flush=True)
        return EXIT_STOPPED
    except Terminated as exc:
        print(f"{prefix}: {exc}", file=sys.stderr, flush=True)
        return EXIT_TERMINATED
    except Exception as exc:
        traceback.print_exc()
        if is_peer_lost(exc):
            print(f"{prefix}: lost a peer rank: {exc}", file=sys.stderr, flush=True)
            return EXIT_PEER_LOST
        print(f"{prefix}: failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return EXIT_FAILED
    print(f"{prefix}: finished {result.steps} steps, final loss {result.final_loss:.4f}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.worker", description="Run one training rank.")
    parser.add_argument("--config", required=True, help="path of the rank's JSON config")
    args = parser.parse_args(argv)
    return run_config_file(args.config)


def exit_process(code: int) -> NoReturn:
    """End the rank's process with ``code`` once everything is written, skipping interpreter teardown.

    By the time a rank returns, its telemetry is closed, its artifact is on disk and its process group
    is destroyed. What remains for a normal exit is tearing down the C++ state of torch.distributed
    (gloo's I/O threads among it) during interpreter shutdown, which now and then aborts the process
    ("terminate called without an active exception", SIGABRT) and turns a finished rank into a failed
    one. Nothing is left to lose, so the process ends here."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
