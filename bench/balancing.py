"""One job across unequal devices: the equal split against the balancer, on the local backend.

    .venv/bin/python bench/balancing.py [--quick]

Each scenario is a real job: one process per rank, gloo, the synthetic-MLP workload, each rank's steps
padded by the local backend's device emulation to ``samples x 1 ms / relative speed`` (real compute is
~1 ms a step, so the padding, not CPU contention, sets the pace). Scenarios, each with ``equal`` and
``dynamic`` balancing in the same run:

- speeds 1:2:4 on 3 ranks; 1:1:3:5 on 4 ranks;
- drift: 1:2:4 where the fastest rank slows 2x halfway (``LocalBackend.set_speed`` while it runs);
  run once per blend (``fixed``: w = 0.6 score + 0.4 predicted throughout; ``trust``: the score's weight
  decays as measurements accumulate), so that the better blend can be the default.

Ideal: the sum of each rank's solo samples/s, measured by running every rank's device alone (a 1-rank
job per speed, all at once, steps of ~100 ms like the gangs') in the same run. Efficiency: the gang's
samples/s (global batch x steps over the time of the steps after a warm-up, from rank 0's telemetry)
over the ideal; for drift, the
ideal is integrated over the run (before and after the slowdown). Re-balance steps: from the first step
at which the slowed rank measured its new speed to the first re-split after it. Loss gap: after the
same steps (the same samples), (L_equal - L_dynamic) / (L_initial - L_dynamic); exactness makes it ~0.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.backends.base import LaunchRequest, Phase, RankPlacement  # noqa: E402
from runtime.backends.local import LocalBackend  # noqa: E402
from runtime.balancing import BalancerConfig  # noqa: E402
from runtime.jobspec import WorkloadSpec  # noqa: E402

SAMPLE_TIME_MS = 1.0  # emulated time per sample at relative speed 1.0
GLOBAL_BATCH = 192
WARMUP_STEPS = 5
SOLO_STEP_MS = 100.0
HIDDEN = 32


@dataclass
class Run:
    job: str
    steps: list[dict[str, Any]]  # rank 0's step events
    rank_steps: dict[int, list[dict[str, Any]]]
    rebalances: list[dict[str, Any]]
    speed_changed_at: float | None = None


def _flavor(speed: float) -> str:
    return "s" + str(speed).replace(".", "p")


def launch(
    backend: LocalBackend,
    job: str,
    speeds: list[float],
    *,
    steps: int,
    mode: str,
    global_batch: int = GLOBAL_BATCH,
    drift: tuple[int, float] | None = None,
) -> dict[str, Any]:
    placements = tuple(
        RankPlacement(rank, f"{job}/{rank}", _flavor(speed), f"node-{job}-{rank}", score=speed)
        for rank, speed in enumerate(speeds)
    )
    request = LaunchRequest(
        job_id=job,
        placements=placements,
        workload=WorkloadSpec(steps=steps, global_batch=global_batch, hidden=HIDDEN),
        telemetry_url=None,
        telemetry_token="",
        artifacts_dir=str(backend.runs_dir / job / "artifacts"),
        balancing=mode,
    )
    return backend.provision(request)


def wait(backend: LocalBackend, handles: dict[str, dict[str, Any]], timeout_s: float = 300) -> None:
    deadline = time.monotonic() + timeout_s
    pending = dict(handles)
    while pending:
        for job, handle in list(pending.items()):
            phase = backend.observe(handle).phase
            if phase == Phase.SUCCEEDED:
                del pending[job]
            elif phase in (Phase.FAILED, Phase.GONE):
                raise RuntimeError(f"{job}: {backend.observe(handle).reason or phase}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"still running after {timeout_s} s: {', '.join(pending)}")
        time.sleep(0.2)


def events(backend: LocalBackend, job: str, world: int) -> Run:
    rank_steps: dict[int, list[dict[str, Any]]] = {}
    rebalances: list[dict[str, Any]] = []
    for rank in range(world):
        path = backend.runs_dir / job / f"telemetry.rank{rank}.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rank_steps[rank] = sorted((e for e in rows if e.get("kind") == "step"), key=lambda e: e["step"])
        if rank == 0:
            rebalances = [e for e in rows if e.get("kind") == "rebalanced"]
    return Run(job, rank_steps[0], rank_steps, rebalances)


def steady_rate(steps: list[dict[str, Any]], samples_per_step: int) -> float:
    timed = [e for e in steps if e["step"] > WARMUP_STEPS]
    seconds = timed[-1]["ts"] - timed[0]["ts"]
    return samples_per_step * (timed[-1]["step"] - timed[0]["step"]) / seconds


def run_jobs(backend: LocalBackend, jobs: dict[str, tuple[list[float], str]], steps: int) -> dict[str, Run]:
    handles = {job: launch(backend, job, speeds, steps=steps, mode=mode) for job, (speeds, mode) in jobs.items()}
    wait(backend, handles)
    return {job: events(backend, job, len(speeds)) for job, (speeds, _) in jobs.items()}


def solo_rates(backend: LocalBackend, speeds: list[float], steps: int) -> dict[float, float]:
    """Each distinct speed alone: a 1-rank job, all of them at once, each step ~100 ms of emulated work
    (about as long as a balanced gang's step here, so that per-step costs weigh alike)."""
    distinct = sorted(set(speeds))
    batch = {s: max(1, round(s * SOLO_STEP_MS / SAMPLE_TIME_MS)) for s in distinct}
    handles = {
        f"solo-{_flavor(s)}": launch(
            backend, f"solo-{_flavor(s)}", [s], steps=steps, mode="equal", global_batch=batch[s]
        )
        for s in distinct
    }
    wait(backend, handles)
    return {s: steady_rate(events(backend, f"solo-{_flavor(s)}", 1).steps, batch[s]) for s in distinct}


def drift_run(backend: LocalBackend, job: str, speeds: list[float], blend: str, steps: int) -> Run:
    """The fastest rank slows 2x once half of the steps are done."""
    slow_rank = max(range(len(speeds)), key=lambda r: speeds[r])
    backend.worker_overrides = {r: {"balancing": {"mode": "dynamic", "blend": blend}} for r in range(len(speeds))}
    try:
        handle = launch(backend, job, speeds, steps=steps, mode="dynamic")
        telemetry = backend.runs_dir / job / "telemetry.rank0.jsonl"
        changed_at = None
        deadline = time.monotonic() + 300
        while backend.observe(handle).phase not in (Phase.SUCCEEDED, Phase.FAILED, Phase.GONE):
            if changed_at is None and telemetry.exists():
                done = sum(1 for line in telemetry.read_text().splitlines() if '"kind":"step"' in line)
                if done >= steps // 2:
                    backend.set_speed(handle, slow_rank, speeds[slow_rank] / 2)
                    changed_at = time.time()
            if time.monotonic() > deadline:
                raise TimeoutError(job)
            time.sleep(0.05)
        if backend.observe(handle).phase != Phase.SUCCEEDED:
            raise RuntimeError(f"{job}: {backend.observe(handle).reason}")
    finally:
        backend.worker_overrides = {}
    run = events(backend, job, len(speeds))
    run.speed_changed_at = changed_at
    return run


def drift_figures(run: Run, speeds: list[float], solo: dict[float, float], slow_rank: int) -> dict[str, float]:
    timed = [e for e in run.steps if e["step"] > WARMUP_STEPS]
    # The step from which the slowed rank measured its new speed: its own samples/s fell below 3/4 of
    # what it measured before the change.
    mine = run.rank_steps[slow_rank]
    before = [e["samples_per_s"] for e in mine if run.speed_changed_at and e["ts"] < run.speed_changed_at][-5:]
    usual = sum(before) / len(before)
    drift_step = next(
        e["step"] for e in mine if e["ts"] >= (run.speed_changed_at or 0) and e["samples_per_s"] < 0.75 * usual
    )
    drift_ts = next(e["ts"] for e in run.steps if e["step"] == drift_step)
    after = [r for r in run.rebalances if r["step"] >= drift_step]
    rebalance_steps = after[0]["step"] - drift_step if after else float("nan")
    ideal_before = sum(solo[s] for s in speeds)
    ideal_after = ideal_before - solo[speeds[slow_rank]] + solo[speeds[slow_rank] / 2]
    start, end = timed[0]["ts"], timed[-1]["ts"]
    ideal_samples = ideal_before * (drift_ts - start) + ideal_after * (end - drift_ts)
    done_samples = GLOBAL_BATCH * (timed[-1]["step"] - timed[0]["step"])
    return {"efficiency": done_samples / ideal_samples, "rebalance_steps": rebalance_steps, "drift_step": drift_step}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps per run")
    args = parser.parse_args()
    steps = 20 if args.quick else 60
    drift_steps = 40 if args.quick else 100
    s124 = [0.25, 0.5, 1.0]  # 1:2:4 as relative speeds (1.0 = 1 ms a sample)
    s1135 = [0.2, 0.2, 0.6, 1.0]  # 1:1:3:5
    out: dict[str, Any] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polychip-balancing-") as tmp:
        every = sorted({*s124, *s1135, 0.5})  # 0.5: the fast rank of 1:2:4 after it slows 2x
        profiles = {_flavor(s): {"relative_speed": s} for s in every}
        backend = LocalBackend(tmp, profiles, sample_time_ms=SAMPLE_TIME_MS, telemetry_files=True)

        print("solo speeds (each device alone) ...", flush=True)
        solo = solo_rates(backend, every, steps)
        for s, rate in solo.items():
            print(f"  speed {s}: {rate:.1f} samples/s")

        for name, speeds in (("124", s124), ("1135", s1135)):
            print(f"speeds {':'.join(name)} on {len(speeds)} ranks: equal and dynamic ...", flush=True)
            runs = run_jobs(
                backend, {f"equal-{name}": (speeds, "equal"), f"dynamic-{name}": (speeds, "dynamic")}, steps
            )
            ideal = sum(solo[s] for s in speeds)
            for mode in ("equal", "dynamic"):
                run = runs[f"{mode}-{name}"]
                rate = steady_rate(run.steps, GLOBAL_BATCH)
                out[f"efficiency_{mode}_{name}"] = round(rate / ideal, 4)
                last = run.steps[-1]
                print(
                    f"  {mode:7s}: {rate:7.1f} samples/s of an ideal {ideal:.1f} ({rate / ideal:.1%}); "
                    f"split {last.get('split') or last.get('samples')}; re-splits {len(run.rebalances)}"
                )
            if name == "124":
                first_loss = runs["equal-124"].steps[0]["loss"]
                l_equal, l_dynamic = runs["equal-124"].steps[-1]["loss"], runs["dynamic-124"].steps[-1]["loss"]
                out["loss_equal"], out["loss_dynamic"] = l_equal, l_dynamic
                out["loss_gap_equal_vs_dynamic"] = (l_equal - l_dynamic) / (first_loss - l_dynamic)
                print(f"  loss after {steps} steps: equal {l_equal:.6f}, dynamic {l_dynamic:.6f}")

        slow_rank = max(range(len(s124)), key=lambda r: s124[r])
        for blend in ("fixed", "trust"):
            print(f"drift: 1:2:4, rank {slow_rank} slows 2x halfway; blend {blend} ...", flush=True)
            run = drift_run(backend, f"drift-{blend}", s124, blend, drift_steps)
            figures = drift_figures(run, s124, solo, slow_rank)
            out[f"efficiency_dynamic_drift_{blend}"] = round(figures["efficiency"], 4)
            out[f"rebalance_steps_{blend}"] = figures["rebalance_steps"]
            print(
                f"  efficiency {figures['efficiency']:.1%}; the slowdown showed at step {figures['drift_step']}; "
                f"first re-split {figures['rebalance_steps']} steps later; re-splits {len(run.rebalances)}"
            )
    best = max(("fixed", "trust"), key=lambda b: out[f"efficiency_dynamic_drift_{b}"])
    default = BalancerConfig().blend
    out["efficiency_dynamic_drift"] = out[f"efficiency_dynamic_drift_{default}"]
    out["rebalance_steps"] = out[f"rebalance_steps_{default}"]
    out["default_blend"], out["better_blend_here"] = default, best
    print(f"default blend: {default}; the better blend in this run: {best}")
    out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
