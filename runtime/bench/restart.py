"""The cost of a checkpoint and restart: what re-placing a running job costs before it trains again.

Measured end to end on a small model (``resnet-small`` of ``runtime.bench.macro`` by default):

1. save the model's and the optimizer's state (after one step, so momentum buffers exist) to a
   file, flushed to disk;
2. start a fresh Python process (``python -m runtime.bench.restart CHECKPOINT CLASS``) that imports
   torch, builds the model, loads the state and takes one training step;
3. stop the clock when that process has exited.

The child reports its own phases (import, load, first step), so the parts add up in ``detail``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_MODULE = "runtime.bench.restart"


@dataclass(frozen=True)
class RestartMeasurement:
    seconds: float  # checkpoint written, fresh process up, state loaded, first step taken
    detail: dict[str, Any] = field(default_factory=dict)


def _save(path: Path, state: dict[str, Any]) -> None:
    import torch

    with open(path, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())


def measure_restart_cost(
    job_class: str = "resnet-small", *, python: str = sys.executable, timeout_s: float = 60.0
) -> RestartMeasurement:
    """Seconds to checkpoint ``job_class``'s model and optimizer, start a fresh process that loads
    them and takes a first step. ``detail`` has each part: checkpoint_s and bytes, process_s (from
    spawn to exit), and the child's import_s, load_s and first_step_s."""
    from runtime.bench.macro import WORKLOADS

    if job_class not in WORKLOADS:
        raise ValueError(f"job_class {job_class!r} has no benchmark model; choose from {', '.join(WORKLOADS)}")
    workload = WORKLOADS[job_class]()
    workload.step()  # the optimizer now holds its momentum buffers, as a running job's does
    with tempfile.TemporaryDirectory(prefix="polychip-restart-") as tmp:
        path = Path(tmp) / "checkpoint.pt"
        started = time.perf_counter()
        _save(path, {"model": workload.model.state_dict(), "optimizer": workload.optimizer.state_dict()})
        saved = time.perf_counter()
        env = dict(os.environ)
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        done = subprocess.run(  # noqa: S603 (our interpreter and module, no shell)
            [python, "-m", _MODULE, str(path), job_class],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
        ended = time.perf_counter()
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"the restarted process failed (exit {done.returncode}): {tail[0]}")
        child = json.loads(done.stdout.strip().splitlines()[-1])
        size = path.stat().st_size
    return RestartMeasurement(
        seconds=ended - started,
        detail={
            "job_class": job_class,
            "checkpoint_s": round(saved - started, 4),
            "checkpoint_bytes": size,
            "process_s": round(ended - saved, 4),
            **{k: round(v, 4) for k, v in child.items()},
            # The interpreter's own start-up and exit, which the child cannot time itself.
            "interpreter_s": round(ended - saved - sum(child.values()), 4),
        },
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The restarted process: import torch, build, load, one step; print its phases as JSON."""
    started = time.perf_counter()
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print(f"usage: python -m {_MODULE} CHECKPOINT JOB_CLASS", file=sys.stderr)  # noqa: T201 (a CLI's error)
        return 2
    import torch

    from runtime.bench.macro import WORKLOADS

    imported = time.perf_counter()
    workload = WORKLOADS[args[1]]()
    state = torch.load(args[0], weights_only=True)
    workload.model.load_state_dict(state["model"])
    workload.optimizer.load_state_dict(state["optimizer"])
    loaded = time.perf_counter()
    workload.step()
    stepped = time.perf_counter()
    phases = {"import_s": imported - started, "load_s": loaded - imported, "first_step_s": stepped - loaded}
    print(json.dumps(phases))  # noqa: T201 (the answer the parent reads from stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
