"""One job across unequal devices: the equal split against the balancer, on the local backend.

    .venv/bin/python bench/balancing.py [--quick]

Each scenario is a real job: one process per rank, gloo, the synthetic-MLP workload, each rank's steps
padded by the local backend's device emulation to ``samples x 1 ms / relative speed`` (real compute is
~1 ms a step, so the padding, not CPU contention, sets the pace). Scenarios, each with ``equal`` and
``dynamic`` balancing in the same run:

- speeds 1:2:4 on 3 ranks; 1:1:3:5 on 4 ranks;
- drift: 1:2:4 where the fastest rank slows 2x halfway (``LocalBackend.set_speed`` while it runs);
  run once per blend (``fixed``: w = 0.6 score + 0.4 predicted throughout; ``trust``: the score's
  weight decays as measurements accumulate), so that the better blend can be the default; ``--quick``
  runs the default blend only;
- two drifts: 1:3:5:8 on 4 ranks (default blend), where the 8 slows to 4 after a third of the steps
  and the 3 speeds up to 6 after two thirds; ``efficiency_dynamic_1358_phase{1,2,3}`` per phase (before
  the first drift, between, after the second), each phase from the step at which the changed rank
  measured its new speed, so that it includes the re-balancing its drift set off (100 steps a phase,
  30 with ``--quick``). Beside each, ``step_ms_1358_phase*``: the step at the ideal rate, the slowest
  rank's own time (compute and padding: what the split and the padding's sleep cost), and the step
  as rank 0 saw it (the difference: per-step costs outside the ranks' own time).

Ideal: the sum of each rank's solo samples/s, measured by running every rank's device alone (a 1-rank
job per speed, all at once, steps of ~160 ms like the gangs') in the same run. Efficiency: the gang's
samples/s (global batch x steps over the time of the steps after a warm-up, from rank 0's telemetry)
over the ideal; for drift, the
ideal is integrated over the run (before and after the slowdown). Re-balance steps: from the first step
at which the slowed rank measured its new speed to the first re-split after it. Loss gap: after the
same steps (the same samples), (L_equal - L_dynamic) / (L_initial - L_dynamic); exactness makes it ~0.

Step length: a global batch of 320 samples makes a balanced step last ~160-180 ms, about what a
training step takes on an accelerator. A step's one exchange (the gradients, with the loss, speeds and
split fingerprints riding in the last bucket) leaves when the backward pass ends and runs while the
padding sleeps. The step's sums used to be a second gloo all-reduce after the padding, which
waited for the slowest rank and then cost a round trip (5-7 ms with 3-4 ranks on this 2-core host,
every hop waiting for a process to be scheduled): 94.5-94.8% per phase of the two-drift scenario,
97.0% (1:2:4) and 96.1% (1:1:3:5). Note what the emulation hides: here the padding comes after the
backward pass, so even the last bucket's exchange overlaps it; on a real chip the last bucket is ready
only when the backward pass ends, and its one exchange per step (two before) is exposed.

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from runtime.backends.base import LaunchRequest, Phase, RankPlacement  # noqa: E402
from runtime.backends.local import LocalBackend  # noqa: E402
from runtime.backends.local.bench import wait_for_jobs  # noqa: E402
from runtime.balancing import BLENDS, BalancerConfig  # noqa: E402
from runtime.jobspec import WorkloadSpec  # noqa: E402

SAMPLE_TIME_MS = 1.0  # emulated time per sample at relative speed 1.0
GLOBAL_BATCH = 320
WARMUP_STEPS = 5
SOLO_STEP_MS = 160.0
HIDDEN = 32


@dataclass
class Run:
    job: str
    steps: list[dict[str, Any]]  # rank 0's step events
    rank_steps: dict[int, list[dict[str, Any]]]
    rebalances: list[dict[str, Any]]
    speed_changed_at: float | None = None
    changed_at: list[float] = field(default_factory=list)  # wall clock of each speed change


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


def run_jobs(backend: LocalBackend, jobs: dict[str, tuple[list[float], str, int]], steps: int) -> dict[str, Run]:
    """Jobs (speeds, balancing mode, global batch) at the same time; their runs once all have finished."""
    handles = {
        job: launch(backend, job, speeds, steps=steps, mode=mode, global_batch=batch)
        for job, (speeds, mode, batch) in jobs.items()
    }
    wait_for_jobs(backend, handles, timeout_s=300)
    return {job: events(backend, job, len(speeds)) for job, (speeds, _, _) in jobs.items()}


def solo_jobs(speeds: list[float]) -> dict[str, tuple[list[float], str, int]]:
    """Each distinct speed alone, a 1-rank job whose step is ~160 ms of emulated work (about as long as a
    balanced gang's step here, so that per-step costs weigh alike)."""
    return {
        f"solo-{_flavor(s)}": ([s], "equal", max(1, round(s * SOLO_STEP_MS / SAMPLE_TIME_MS)))
        for s in sorted(set(speeds))
    }


@dataclass(frozen=True)
class Change:
    """A speed change: once rank 0 has reported ``after_steps`` steps, ``rank`` runs at ``speed``."""

    after_steps: int
    rank: int
    speed: float


def run_with_changes(jobs: dict[str, tuple[LocalBackend, dict[str, Any], list[Change]]]) -> dict[str, list[float]]:
    """Jobs already launched, each with its speed changes, applied (``LocalBackend.set_speed``) while they
    run; waits for all of them and returns when each change was made (wall clock), per job."""
    changed_at: dict[str, list[float]] = {job: [] for job in jobs}
    deadline = time.monotonic() + 300
    running = set(jobs)
    while running:
        for job in sorted(running):
            backend, handle, changes = jobs[job]
            phase = backend.observe(handle).phase
            if phase in (Phase.FAILED, Phase.GONE):
                raise RuntimeError(f"{job}: {backend.observe(handle).reason or phase}")
            if phase == Phase.SUCCEEDED:
                running.discard(job)
                continue
            made = changed_at[job]
            telemetry = backend.runs_dir / job / "telemetry.rank0.jsonl"
            if len(made) < len(changes) and telemetry.exists():
                done = sum(1 for line in telemetry.read_text().splitlines() if '"kind":"step"' in line)
                change = changes[len(made)]
                if done >= change.after_steps:
                    backend.set_speed(handle, change.rank, change.speed)
                    made.append(time.time())
        if time.monotonic() > deadline:
            raise TimeoutError(f"runs with speed changes still going: {', '.join(sorted(running))}")
        time.sleep(0.05)
    return changed_at


def drift_runs(
    tmp: str, profiles: dict[str, dict[str, float]], speeds: list[float], steps: int, blends: tuple[str, ...]
) -> dict[str, Run]:
    """One job per blend, at the same time: the fastest rank of each slows 2x once half its steps are done."""
    slow_rank = max(range(len(speeds)), key=lambda r: speeds[r])
    jobs: dict[str, tuple[LocalBackend, dict[str, Any], list[Change]]] = {}
    for blend in blends:
        # A backend per blend: the blend reaches the workers through the backend's per-rank overrides.
        overrides = {r: {"balancing": {"mode": "dynamic", "blend": blend}} for r in range(len(speeds))}
        backend = LocalBackend(
            tmp, profiles, sample_time_ms=SAMPLE_TIME_MS, telemetry_files=True, worker_overrides=overrides
        )
        handle = launch(backend, f"drift-{blend}", speeds, steps=steps, mode="dynamic")
        jobs[f"drift-{blend}"] = (backend, handle, [Change(steps // 2, slow_rank, speeds[slow_rank] / 2)])
    changed_at = run_with_changes(jobs)
    runs = {}
    for blend in blends:
        backend = jobs[f"drift-{blend}"][0]
        runs[blend] = events(backend, f"drift-{blend}", len(speeds))
        made = changed_at[f"drift-{blend}"]
        runs[blend].speed_changed_at = made[0] if made else None
    return runs


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
    costs = [r["cost_s"] for r in run.rebalances]
    return {
        "efficiency": done_samples / ideal_samples,
        "rebalance_steps": rebalance_steps,
        "drift_step": drift_step,
        # A re-split moves no data (every rank can read every sample); its cost is the decision, timed
        # by the worker, and the next step runs on the new split.
        "resplit_cost_ms": 1000 * sum(costs) / len(costs) if costs else float("nan"),
    }


def two_drift_run(
    tmp: str, profiles: dict[str, dict[str, float]], speeds: list[float], steps: int, changes: list[Change]
) -> Run:
    """The default blend on ``speeds``, each change made once rank 0 has reported its step count."""
    backend = LocalBackend(tmp, profiles, sample_time_ms=SAMPLE_TIME_MS, telemetry_files=True)
    job = "drift2-" + "".join(str(round(s / min(speeds))) for s in speeds)
    handle = launch(backend, job, speeds, steps=steps, mode="dynamic")
    changed_at = run_with_changes({job: (backend, handle, changes)})[job]
    if len(changed_at) != len(changes):
        raise RuntimeError(f"{job} ended after {len(changed_at)} of {len(changes)} speed changes: more steps")
    run = events(backend, job, len(speeds))
    run.changed_at = changed_at
    return run


def shows_at(run: Run, rank: int, changed_at: float, old: float, new: float) -> int:
    """The first step at which ``rank`` measured the speed it was changed to: its samples/s moved more
    than half way (geometrically) from what it measured before the change towards ``new / old`` of it."""
    mine = run.rank_steps[rank]
    before = [e["samples_per_s"] for e in mine if e["ts"] < changed_at][-5:]
    usual = sum(before) / len(before)
    half = abs(math.log(new / old)) / 2
    return next(
        e["step"]
        for e in mine
        if e["ts"] >= changed_at and e["samples_per_s"] > 0 and abs(math.log(e["samples_per_s"] / usual)) > half
    )


def phase_figures(
    run: Run, speeds: list[float], changes: list[Change], solo: dict[float, float], global_batch: int = GLOBAL_BATCH
) -> list[dict[str, float]]:
    """Per phase (before the first change, between changes, after the last): the gang's samples over the
    ideal integrated over the phase (the sum of the solo speeds of the ranks' speeds then). A phase
    runs from the step at which the changed rank measured its new speed, so each phase includes the
    re-balancing that its change set off. Beside it, where each phase's time went, per step on
    average: ``ideal_ms``, the step at the ideal rate; ``slowest_ms``, the own time (compute and
    padding, with the padding's oversleep) of the rank slowest on average over the phase: the pace the
    split sets; ``step_ms``, rank 0's step to step interval; the rest is per-step cost outside the
    ranks' own time (an exposed exchange, the optimizer, telemetry, the next step's start)."""
    timed = [e for e in run.steps if e["step"] > WARMUP_STEPS]
    by_step = {e["step"]: e for e in timed}
    current = list(speeds)
    rates = [sum(solo[s] for s in current)]
    bounds = [timed[0]["step"]]
    for change, at in zip(changes, run.changed_at, strict=True):
        step = shows_at(run, change.rank, at, current[change.rank], change.speed)
        current[change.rank] = change.speed
        rates.append(sum(solo[s] for s in current))
        bounds.append(step)
    bounds.append(timed[-1]["step"])
    own = {r: {e["step"]: e["own_time_s"] for e in events} for r, events in run.rank_steps.items()}
    out = []
    for p, rate in enumerate(rates):
        first, last = bounds[p], bounds[p + 1]
        seconds = by_step[last]["ts"] - by_step[first]["ts"]
        steps = range(first + 1, last + 1)
        out.append(
            {
                "efficiency": global_batch * len(steps) / (rate * seconds),
                "steps": len(steps),
                "ideal_ms": 1000 * global_batch / rate,
                "step_ms": 1000 * seconds / len(steps),
                "slowest_ms": 1000 * max(sum(mine.get(s, 0.0) for s in steps) / len(steps) for mine in own.values()),
            }
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps per run")
    args = parser.parse_args()
    steps = 11 if args.quick else 60
    drift_steps = 24 if args.quick else 100
    s124 = [0.25, 0.5, 1.0]  # 1:2:4 as relative speeds (1.0 = 1 ms a sample)
    s1135 = [0.2, 0.2, 0.6, 1.0]  # 1:1:3:5
    s1358 = [0.125, 0.375, 0.625, 1.0]  # 1:3:5:8, then two drifts: the 8 slows to 4, later the 3 speeds up to 6
    two_drift_steps = 90 if args.quick else 300
    changes = [Change(two_drift_steps // 3, 3, 0.5), Change(2 * two_drift_steps // 3, 1, 0.75)]
    out: dict[str, Any] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polychip-balancing-") as tmp:
        # 0.5: the fast rank of 1:2:4 after it slows 2x; the speeds of 1:3:5:8 before and after its drifts.
        every = sorted({*s124, *s1135, 0.5, *s1358, *(c.speed for c in changes)})
        profiles = {_flavor(s): {"relative_speed": s} for s in every}
        backend = LocalBackend(tmp, profiles, sample_time_ms=SAMPLE_TIME_MS, telemetry_files=True)

        # The solo runs share their start-up with the first pair: single-rank jobs have no collective, and
        # once started each process mostly sleeps in its padding, so they do not slow each other.
        solos = solo_jobs(every)
        solo: dict[float, float] = {}
        for name, speeds in (("124", s124), ("1135", s1135)):
            print(f"speeds {':'.join(name)} on {len(speeds)} ranks: equal and dynamic ...", flush=True)
            jobs = {
                f"equal-{name}": (speeds, "equal", GLOBAL_BATCH),
                f"dynamic-{name}": (speeds, "dynamic", GLOBAL_BATCH),
            }
            runs = run_jobs(backend, {**jobs, **(solos if not solo else {})}, steps)
            if not solo:
                solo = {s: steady_rate(runs[f"solo-{_flavor(s)}"].steps, solos[f"solo-{_flavor(s)}"][2]) for s in every}
                for s, rate in solo.items():
                    print(f"  speed {s} alone: {rate:.1f} samples/s")
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
        # --quick runs the default blend only; the full run compares the blends.
        blends = (BalancerConfig().blend,) if args.quick else BLENDS
        print(f"drift: 1:2:4, rank {slow_rank} slows 2x halfway; blends {' and '.join(blends)} ...", flush=True)
        for blend, run in drift_runs(tmp, profiles, s124, drift_steps, blends).items():
            figures = drift_figures(run, s124, solo, slow_rank)
            out[f"efficiency_dynamic_drift_{blend}"] = round(figures["efficiency"], 4)
            out[f"rebalance_steps_{blend}"] = figures["rebalance_steps"]
            out[f"resplit_cost_ms_{blend}"] = round(figures["resplit_cost_ms"], 3)
            print(
                f"  {blend}: efficiency {figures['efficiency']:.1%}; the slowdown showed at step "
                f"{figures['drift_step']}; first re-split {figures['rebalance_steps']} steps later; "
                f"re-splits {len(run.rebalances)}, {figures['resplit_cost_ms']:.3f} ms each to decide"
            )

        print(
            "two drifts: 1:3:5:8, rank 3 slows 8 -> 4 after a third of the steps, rank 1 speeds up 3 -> 6 "
            "after two thirds ...",
            flush=True,
        )
        run = two_drift_run(tmp, profiles, s1358, two_drift_steps, changes)
        for p, figures in enumerate(phase_figures(run, s1358, changes, solo), start=1):
            out[f"efficiency_dynamic_1358_phase{p}"] = round(figures["efficiency"], 4)
            out[f"step_ms_1358_phase{p}"] = {k: round(figures[k], 2) for k in ("ideal_ms", "slowest_ms", "step_ms")}
            print(
                f"  phase {p} ({figures['steps']:.0f} steps): efficiency {figures['efficiency']:.1%}; per step "
                f"{figures['step_ms']:.1f} ms where the ideal is {figures['ideal_ms']:.1f} ms: the slowest rank's "
                f"own time {figures['slowest_ms']:.1f} ms, the rest {figures['step_ms'] - figures['slowest_ms']:.1f} ms"
            )
        print(f"  re-splits at steps {[r['step'] for r in run.rebalances]}")
    default = BalancerConfig().blend
    best = max(blends, key=lambda b: out[f"efficiency_dynamic_drift_{b}"])
    out["efficiency_dynamic_drift"] = out[f"efficiency_dynamic_drift_{default}"]
    out["rebalance_steps"] = out[f"rebalance_steps_{default}"]
    out["default_blend"], out["better_blend_here"] = default, best
    print(f"default blend: {default}; the better blend in this run: {best}")
    out["wall_s"] = round(time.monotonic() - started, 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
