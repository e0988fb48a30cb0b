"""Communication policies side by side: bytes on the slow link, step time throttled and not, final loss.

    .venv/bin/python bench/comm.py [--quick]

Every run is a real job on the local backend: 3 ranks (one process each, gloo), each of a different
vendor (three groups, so every byte of the gradient exchange crosses a group boundary), the
synthetic-MLP workload with ``hidden`` 1024 (1,093,642 parameters, 4.4 MB of fp32 gradient). Each
rank's step is padded by the backend's device emulation to ``samples x SAMPLE_TIME_MS`` (as an
accelerator would take), so that compute has an accelerator's pace and the CPU of this 2-core host is
left to the exchange. Policies: ``none``, ``fp16``, ``bf16``, ``topk10``, ``topk1``, ``powersgd4``,
``auto``; each twice:

- throttled: the backend shapes every group's uplink to 1 Gbit/s (``tc`` in network namespaces where
  the machine allows it, else the ranks' token bucket; the output says which ran);
- unthrottled: loopback.

Figures, per policy:

- ``bytes_ratio``: bytes sent on the cross-group link per step, all ranks together, values, indices,
  headers and the step's small loss/speed all-reduce included (counted by ``runtime.comm.transport``
  from the buffers really sent), over ``none``'s; averaged over the steps after the top-k warm-up;
- ``step_s_throttled`` / ``step_s_unthrottled``: the median of rank 0's step times after the warm-up;
- ``loss_gap``: (L_policy - L_none) / (L_initial - L_none), L the mean global loss of the last 10
  steps (the same samples for every policy), from the throttled runs;
- ``hidden_share``: the share of collective time that the backward pass and the device's compute hid.

``throttled_speedup_best``: ``none``'s throttled step time over the best policy's. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import os  # noqa: E402  (tuning only)

from runtime.backends.base import LaunchRequest, Phase, RankPlacement  # noqa: E402
from runtime.backends.local import LocalBackend  # noqa: E402
from runtime.jobspec import WorkloadSpec, parse_comm  # noqa: E402
from runtime.worker.config import synthetic_mlp_param_count  # noqa: E402

HIDDEN = int(os.environ.get("HID", 1024))
GLOBAL_BATCH = int(os.environ.get("GB", 48))
SAMPLE_TIME_MS = float(
    os.environ.get("STM", 1.0)
)  # emulated compute per sample at relative speed 1.0: 16 ms a step per rank
LINK_GBIT = 1.0
WARMUP_STEPS = 10  # top-k's density warm-up; the first steps also open connections
LAST_STEPS = 10
VENDORS = ("nvidia", "huawei", "google")
POLICIES: dict[str, dict[str, Any]] = {
    "none": {"compression": "none"},
    "fp16": {"compression": "fp16"},
    "bf16": {"compression": "bf16"},
    "topk10": {"compression": "topk", "density": 0.1},
    "topk1": {"compression": "topk", "density": 0.01},
    "powersgd4": {"compression": "powersgd", "rank": 4},
    "auto": {"compression": "auto"},
}


def run_job(backend: LocalBackend, job: str, comm: dict[str, Any], steps: int) -> dict[str, Any]:
    placements = tuple(
        RankPlacement(rank, f"{job}/{rank}", "bench", f"node-{rank}", vendor=vendor)
        for rank, vendor in enumerate(VENDORS)
    )
    request = LaunchRequest(
        job_id=job,
        placements=placements,
        workload=WorkloadSpec(steps=steps, global_batch=GLOBAL_BATCH, lr=0.05, seed=11, hidden=HIDDEN),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(backend.runs_dir / job / "artifacts"),
        balancing="equal",
        comm=parse_comm({**comm, "warmup_steps": WARMUP_STEPS, "bucket_mb": 1.0}),
    )
    handle = backend.provision(request)
    deadline = time.monotonic() + 600
    while (observation := backend.observe(handle)).phase not in (Phase.SUCCEEDED, Phase.FAILED, Phase.GONE):
        if time.monotonic() > deadline:
            backend.teardown(handle)
            raise TimeoutError(f"{job}: still running after 600 s")
        time.sleep(0.2)
    if observation.phase != Phase.SUCCEEDED:
        raise RuntimeError(f"{job}: {observation.reason or observation.phase}")
    run_dir = backend.runs_dir / job
    events = {
        rank: [json.loads(line) for line in (run_dir / f"telemetry.rank{rank}.jsonl").read_text().splitlines()]
        for rank in range(len(VENDORS))
    }
    launch = json.loads((run_dir / "launch.json").read_text())
    steps_of = {rank: [e for e in rows if e["kind"] == "step"] for rank, rows in events.items()}
    steady = [e for e in steps_of[0] if e["step"] > WARMUP_STEPS]
    cross = statistics.mean(
        sum(e["comm_bytes_cross"] for e in (steps_of[r][i] for r in steps_of)) for i in range(WARMUP_STEPS, steps)
    )
    comm_event = next(e for e in events[0] if e["kind"] == "comm")
    losses = [e["loss"] for e in steps_of[0]]
    return {
        "cross_bytes_per_step": cross,
        "step_s": statistics.median(e["step_time_s"] for e in steady),
        "hidden_share": statistics.mean(e["hidden_share"] for e in steady),
        "loss_initial": losses[0],
        "loss_final": statistics.mean(losses[-LAST_STEPS:]),
        "policy": comm_event["policy"],
        "reason": comm_event["reason"],
        "link": launch.get("link_note") or launch.get("link", {}).get("mode", "none"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (under a minute), the same figures")
    args = parser.parse_args(argv)
    steps = 40 if args.quick else 150
    params = synthetic_mlp_param_count(HIDDEN)
    print(f"3 ranks, 3 vendor groups, {params:,} parameters, {steps} steps per run", file=sys.stderr)
    results: dict[str, dict[str, dict[str, Any]]] = {"throttled": {}, "unthrottled": {}}
    with tempfile.TemporaryDirectory(prefix="polychip-comm-") as tmp:
        profiles = {"bench": {"relative_speed": 1.0}}
        backends = {
            "throttled": LocalBackend(
                Path(tmp) / "throttled",
                profiles,
                sample_time_ms=SAMPLE_TIME_MS,
                telemetry_files=True,
                link_gbit=LINK_GBIT,
            ),
            "unthrottled": LocalBackend(
                Path(tmp) / "unthrottled", profiles, sample_time_ms=SAMPLE_TIME_MS, telemetry_files=True
            ),
        }
        only = os.environ.get("ONLY")
        for name, comm in POLICIES.items():
            if only and name not in only.split(","):
                continue
            for mode, backend in backends.items():
                started = time.monotonic()
                result = run_job(backend, f"{name}-{mode}", comm, steps)
                results[mode][name] = result
                print(
                    f"{name:10} {mode:11} {result['policy']:22} cross {result['cross_bytes_per_step'] / 1e6:8.3f} MB/step"
                    f"  step {result['step_s'] * 1e3:7.1f} ms  hidden {result['hidden_share']:.0%}"
                    f"  loss {result['loss_final']:.4f}  ({time.monotonic() - started:.0f} s)",
                    file=sys.stderr,
                )
    if os.environ.get("ONLY"):
        return 0
    throttled, unthrottled = results["throttled"], results["unthrottled"]
    reference = throttled["none"]
    figures: dict[str, Any] = {}
    for name in POLICIES:
        mine = throttled[name]
        span = reference["loss_initial"] - reference["loss_final"]
        figures[f"{name}.bytes_ratio"] = round(mine["cross_bytes_per_step"] / reference["cross_bytes_per_step"], 4)
        figures[f"{name}.loss_gap"] = round((mine["loss_final"] - reference["loss_final"]) / span, 4)
        figures[f"{name}.step_s_throttled"] = round(mine["step_s"], 4)
        figures[f"{name}.step_s_unthrottled"] = round(unthrottled[name]["step_s"], 4)
        figures[f"{name}.hidden_share"] = round(mine["hidden_share"], 3)
    best = min(POLICIES, key=lambda n: throttled[n]["step_s"])
    figures["throttled_speedup_best"] = round(reference["step_s"] / throttled[best]["step_s"], 2)
    figures["best_throttled"] = best
    figures["auto.chose"] = throttled["auto"]["policy"]
    figures["auto.chose_unthrottled"] = unthrottled["auto"]["policy"]
    figures["link"] = reference["link"]
    figures["none.cross_bytes_per_step"] = round(reference["cross_bytes_per_step"])
    figures["params"] = params
    figures["steps"] = steps
    print(f"auto, throttled: {throttled['auto']['reason']}", file=sys.stderr)
    print(f"auto, unthrottled: {unthrottled['auto']['reason']}", file=sys.stderr)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
