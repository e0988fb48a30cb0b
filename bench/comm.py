"""Communication policies side by side: bytes on the slow link, step time throttled and not, final loss.

    .venv/bin/python bench/comm.py [--quick]

Every run is a real job on the local backend: 3 ranks (one process each, gloo), each of a different
vendor (three groups, so every byte of the gradient exchange crosses a group boundary), the
synthetic-MLP workload, the spec's default buckets (25 MB) and overlap, real compute (no emulated
padding). The cross-group link is shaped to 1 Gbit/s per group (``tc`` in network namespaces where the
machine allows it, else the ranks' token bucket; ``link`` in the output says which ran). Policies:
``none``, ``fp16``, ``bf16``, ``topk10``, ``topk1``, ``powersgd4``, ``auto``. Two job shapes:

- loss: ``hidden`` 1024 (1,093,642 parameters), a global batch of 96, 250 steps (60 with ``--quick``),
  every policy at once (the loss does not depend on time). A batch this size keeps runs that differ
  only in rounding on nearby paths: at a batch of 12 even fp32 against bf16 ended 25% apart in loss,
  the noise of chaotic small-batch SGD rather than anything the policy gives up;
- speed: ``hidden`` 2048 (4,284,426 parameters, 17 MB of fp32 gradient), a global batch of 12, 50
  steps (18), one job at a time, with the link shaped and (``--quick``: ``none`` only) unshaped. On
  this 2-core host the 3 ranks share 2 cores, so each policy's own CPU work (its compression, the
  optimizer, the backward pass) sets a floor under its step; a small batch keeps the backward pass
  from burying the link.

Figures, per policy:

- ``bytes_ratio``: bytes sent on the cross-group link per step, all ranks together (values, indices,
  headers, scales and the step's small loss/speed all-reduce, counted by ``runtime.comm.transport``
  from the buffers really sent), over ``none``'s; the steps after the top-k warm-up, speed shape;
- ``step_s_throttled`` / ``step_s_unthrottled``: the median of rank 0's step times after the warm-up;
- ``loss_gap``: (L_policy - L_none) / (L_initial - L_none), L the mean global loss of the last 20
  steps (the same samples for every policy), loss shape;
- ``hidden_share``: the share of collective time that the backward pass hid. With the default 25 MB
  buckets each model is one bucket, which goes only once the backward pass is over, so this is small;
  ``none_2mb_buckets`` runs ``none`` once more in 2 MB buckets. It measured about as little hidden
  (0.9%): in this MLP 98% of the gradient is the middle layer's matrix, and once backward has
  finished it only the small first layer is left to compute behind it.

``throttled_speedup_best``: ``none``'s throttled step time over the best policy's. The last line is
one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))


from runtime.backends.base import LaunchRequest, RankPlacement  # noqa: E402
from runtime.backends.local import LocalBackend  # noqa: E402
from runtime.backends.local.bench import step_events, telemetry_events, wait_for_jobs  # noqa: E402
from runtime.jobspec import WorkloadSpec, parse_comm  # noqa: E402
from runtime.worker.config import synthetic_mlp_param_count  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """A job shape: the model, the batch and the steps."""

    name: str
    hidden: int
    global_batch: int
    steps: int
    warmup_steps: int  # top-k's density warm-up, and the steps left out of the timing


LINK_GBIT = 1.0
LAST_STEPS = 20  # the loss: the mean global loss over these last steps
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


def launch(backend: LocalBackend, job: str, comm: dict[str, Any], shape: Shape) -> dict[str, Any]:
    placements = tuple(
        RankPlacement(rank, f"{job}/{rank}", "bench", f"node-{rank}", vendor=vendor)
        for rank, vendor in enumerate(VENDORS)
    )
    workload = WorkloadSpec(steps=shape.steps, global_batch=shape.global_batch, lr=0.05, seed=11, hidden=shape.hidden)
    request = LaunchRequest(
        job_id=job,
        placements=placements,
        workload=workload,
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(backend.runs_dir / job / "artifacts"),
        balancing="equal",
        comm=parse_comm({**comm, "warmup_steps": shape.warmup_steps}),
    )
    return backend.provision(request)


def figures_of(backend: LocalBackend, job: str, shape: Shape) -> dict[str, Any]:
    run_dir = backend.runs_dir / job
    launch_file = json.loads((run_dir / "launch.json").read_text())
    steps_of = {rank: step_events(run_dir / f"telemetry.rank{rank}.jsonl") for rank in range(len(VENDORS))}
    steady = [e for e in steps_of[0] if e["step"] > shape.warmup_steps]
    # Every rank's bytes on the cross-group link in the same step, summed; averaged over the steady steps.
    cross = statistics.mean(
        sum(steps_of[r][i]["comm_bytes_cross"] for r in steps_of) for i in range(shape.warmup_steps, shape.steps)
    )
    comm_event = telemetry_events(run_dir / "telemetry.rank0.jsonl", "comm")[0]
    losses = [e["loss"] for e in steps_of[0]]
    return {
        "cross_bytes_per_step": cross,
        "step_s": statistics.median(e["step_time_s"] for e in steady),
        "hidden_share": statistics.mean(e["hidden_share"] for e in steady),
        "loss_initial": losses[0],
        "loss_final": statistics.mean(losses[-LAST_STEPS:]),
        "policy": comm_event["policy"],
        "reason": comm_event["reason"],
        "link": launch_file.get("link_note") or launch_file.get("link", {}).get("mode", "none"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, the same figures")
    args = parser.parse_args(argv)
    quick = args.quick
    speed = Shape("speed", hidden=2048, global_batch=12, steps=18 if quick else 50, warmup_steps=8)
    loss = Shape("loss", hidden=1024, global_batch=96, steps=60 if quick else 250, warmup_steps=20)
    profiles = {"bench": {"relative_speed": 1.0}}
    timing: dict[str, dict[str, dict[str, Any]]] = {"throttled": {}, "unthrottled": {}}
    made: list[LocalBackend] = []
    with tempfile.TemporaryDirectory(prefix="polychip-comm-") as tmp, contextlib.ExitStack() as cleanup:
        # Before the folder goes: every run's processes are gone (a rank still writing into it made
        # the folder's removal fail on a loaded host).
        cleanup.callback(lambda: [b.tear_down_every_run() for b in made])

        def backend(name: str, link_gbit: float | None) -> LocalBackend:
            made.append(
                LocalBackend(Path(tmp) / name, profiles, sample_time_ms=0.0, telemetry_files=True, link_gbit=link_gbit)
            )
            return made[-1]

        # Loss: every policy at once (the loss does not depend on time), on the shaped link so that
        # auto decides as it does below.
        print(f"loss: {loss}, every policy at once", file=sys.stderr)
        started = time.monotonic()
        losses_backend = backend("loss", LINK_GBIT)
        handles = {name: launch(losses_backend, f"loss-{name}", comm, loss) for name, comm in POLICIES.items()}
        wait_for_jobs(losses_backend, handles, timeout_s=900)
        losses = {name: figures_of(losses_backend, f"loss-{name}", loss) for name in POLICIES}
        print(f"  ({time.monotonic() - started:.0f} s)", file=sys.stderr)
        # Time and bytes: one job at a time.
        print(f"speed: {speed}, one at a time", file=sys.stderr)
        backends = {"throttled": backend("throttled", LINK_GBIT), "unthrottled": backend("unthrottled", None)}
        for name, comm in POLICIES.items():
            for mode, chosen in backends.items():
                if quick and mode == "unthrottled" and name != "none":
                    continue  # --quick: the unthrottled baseline only
                started = time.monotonic()
                job = f"{name}-{mode}"
                wait_for_jobs(chosen, {job: launch(chosen, job, comm, speed)}, timeout_s=900)
                result = timing[mode][name] = figures_of(chosen, job, speed)
                print(
                    f"  {name:10} {mode:11} {result['policy']:22}"
                    f" cross {result['cross_bytes_per_step'] / 1e6:8.3f} MB/step"
                    f"  step {result['step_s'] * 1e3:7.1f} ms  hidden {result['hidden_share']:.0%}"
                    f"  ({time.monotonic() - started:.0f} s)",
                    file=sys.stderr,
                )
        # Overlap: with the default 25 MB buckets the whole gradient is one bucket, which can only go
        # once the backward pass is over; in 2 MB buckets each bucket goes as soon as it is finished.
        small = {"compression": "none", "bucket_mb": 2.0}
        job = "none-2mb-throttled"
        wait_for_jobs(backends["throttled"], {job: launch(backends["throttled"], job, small, speed)}, timeout_s=900)
        overlapped = figures_of(backends["throttled"], job, speed)
    throttled, unthrottled = timing["throttled"], timing["unthrottled"]
    reference, reference_loss = throttled["none"], losses["none"]
    span = reference_loss["loss_initial"] - reference_loss["loss_final"]
    figures: dict[str, Any] = {}
    for name in POLICIES:
        mine = throttled[name]
        figures[f"{name}.bytes_ratio"] = round(mine["cross_bytes_per_step"] / reference["cross_bytes_per_step"], 4)
        figures[f"{name}.loss_gap"] = round((losses[name]["loss_final"] - reference_loss["loss_final"]) / span, 4)
        figures[f"{name}.loss_final"] = round(losses[name]["loss_final"], 4)
        figures[f"{name}.step_s_throttled"] = round(mine["step_s"], 4)
        if name in unthrottled:
            figures[f"{name}.step_s_unthrottled"] = round(unthrottled[name]["step_s"], 4)
        figures[f"{name}.hidden_share"] = round(mine["hidden_share"], 3)
        print(
            f"{name:10} bytes {figures[f'{name}.bytes_ratio']:7.2%}  loss gap {figures[f'{name}.loss_gap']:+.2%}"
            f"  step {mine['step_s'] * 1e3:6.1f} ms throttled",
            file=sys.stderr,
        )
    best = min(POLICIES, key=lambda n: throttled[n]["step_s"])
    figures["throttled_speedup_best"] = round(reference["step_s"] / throttled[best]["step_s"], 2)
    figures["best_throttled"] = best
    figures["auto.chose"] = throttled["auto"]["policy"]
    figures["auto.chose_for_loss"] = losses["auto"]["policy"]
    if figures["auto.chose"] != figures["auto.chose_for_loss"]:
        figures["auto.loss_gap"] = None  # the loss run chose another policy: its gap would not be auto's
    figures["none_2mb_buckets.step_s_throttled"] = round(overlapped["step_s"], 4)
    figures["none_2mb_buckets.hidden_share"] = round(overlapped["hidden_share"], 3)
    figures["link"] = reference["link"]
    figures["none.cross_bytes_per_step"] = round(reference["cross_bytes_per_step"])
    figures["speed_shape"] = {"params": synthetic_mlp_param_count(speed.hidden), **asdict(speed)}
    figures["loss_shape"] = {"params": synthetic_mlp_param_count(loss.hidden), **asdict(loss)}
    print(f"auto (speed runs): {throttled['auto']['reason']}", file=sys.stderr)
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
