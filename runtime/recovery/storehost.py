"""The c10d rendezvous store in a process of its own: ``python -m runtime.recovery.storehost HOST PORT``.

torch.distributed's default rendezvous makes rank 0 host the TCP store that every rank connects to,
so the death of rank 0 takes the store down with it: measured with torchrun on this machine, 3 of 12
trials that killed the rank hosting the store never recovered. Here the store lives in a small
process that holds no training state, started before the ranks and stopped after them; every rank
is a client (``WorkerConfig.rendezvous == "store_host"``). The local backend's supervisor runs one
per launch; on Kubernetes it would be a pod of its own beside the job's.

It prints ``ready HOST PORT`` once the store listens, then serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from types import FrameType


def wait_until_listening(host: str, port: int, timeout_s: float) -> bool:
    """True once a TCP connection to ``host:port`` succeeds, False after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.recovery.storehost")
    parser.add_argument("host", help="address to listen on")
    parser.add_argument("port", type=int, help="TCP port to listen on")
    args = parser.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)

    # Imported after the handlers: torch's import takes a second or two, and a teardown in that
    # window must still end this process cleanly.
    import torch.distributed as dist

    try:
        store = dist.TCPStore(
            args.host, args.port, world_size=None, is_master=True, timeout=timedelta(seconds=30), wait_for_workers=False
        )
    except Exception as exc:
        print(f"storehost: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr, flush=True)  # noqa: T201
        return 1
    # T201: a process's output: the error above for its log, this line for whoever waits on it to listen.
    print(f"ready {args.host} {args.port}", flush=True)  # noqa: T201
    while not stop.wait(timeout=1.0):
        pass
    del store
    return 0


if __name__ == "__main__":
    sys.exit(main())
