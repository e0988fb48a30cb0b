"""Balancing efficiency: how close a gang of unequal devices comes to the sum of its parts.

A mixed gang splits its global batch in proportion to each device's speed, so that every rank's
step should take the same time. What it loses (the collectives, the wait for the slowest rank when
the split is not exact, the jitter of each rank) is what this measures:

    efficiency = the gang's samples/s / the sum of each rank's samples/s when it trains alone

where each rank trains alone on the same micro-batch at the same emulated speed. Ranks are real
worker processes (``runtime.worker``, gloo, on the ``synthetic-mlp`` workload), launched by
the local backend at their relative speeds (``runtime.backends.local.bench.run_emulated_ranks``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime.backends.local import find_free_port
from runtime.backends.local.bench import RankRun, run_emulated_ranks
from runtime.balancing import proportional_split
from runtime.jobspec import WorkloadSpec
from runtime.worker.config import WorkerConfig

# Steps whose timing is left out: the first include the rendezvous and first-call costs.
WARMUP_STEPS = 5


@dataclass(frozen=True)
class BalanceMeasurement:
    efficiency: float  # the gang's samples/s over the sum of the ranks' solo samples/s
    detail: dict[str, Any] = field(default_factory=dict)


def steady_rate(steps: Sequence[dict[str, Any]], samples_per_step: int) -> tuple[float, int]:
    """samples/s over the steps after WARMUP_STEPS, from the steps' timestamps: (rate, steps timed)."""
    timed = [e for e in steps if e["step"] > WARMUP_STEPS]
    if len(timed) < 2:
        raise RuntimeError(f"only {len(timed)} steps after warm-up; run more steps")
    seconds = timed[-1]["ts"] - timed[0]["ts"]
    intervals = timed[-1]["step"] - timed[0]["step"]
    return samples_per_step * intervals / seconds, intervals


def _configs(job_id: str, micro_batches: Sequence[int], spec: WorkloadSpec, artifacts: str) -> list[WorkerConfig]:
    port = find_free_port()
    return [
        WorkerConfig(
            job_id=job_id,
            rank=rank,
            world_size=len(micro_batches),
            master_addr="127.0.0.1",
            master_port=port,
            flavor="emulated",
            device_id=f"{job_id}/{rank}",
            workload=spec,
            micro_batches=tuple(micro_batches),
            artifacts_dir=artifacts,
            collective_timeout_s=60.0,
        )
        for rank in range(len(micro_batches))
    ]


def _check(runs: Sequence[RankRun], what: str) -> None:
    for run in runs:
        if run.exit_code != 0:
            raise RuntimeError(f"{what}: rank {run.rank} exited with {run.exit_code}: {run.stderr_tail or 'no output'}")


def measure_balance_efficiency(
    relative_speeds: Sequence[float] = (1.0, 0.5),
    *,
    steps: int = 30,
    global_batch: int = 96,
    sample_time_ms: float = 0.5,
    timeout_s: float = 120.0,
) -> BalanceMeasurement:
    """Measure the balancing efficiency of a gang of ranks at ``relative_speeds`` (2 or 3 ranks).

    Each rank trains alone on its share of the batch (its own world of one), and all ranks train
    together as one gang with the global batch split in proportion to speed; solos and gang run
    at the same time. ``sample_time_ms`` is the local backend's emulated time per sample at speed
    1.0. Takes one round of process start-up (a few seconds on two cores) plus ``steps`` steps.

    Returns the efficiency and ``detail``: speeds, split, each rank's solo samples/s, their sum, the
    gang's samples/s and the steps timed.
    """
    import tempfile

    if not 2 <= len(relative_speeds) <= 8:
        raise ValueError(f"relative_speeds: give 2 to 8 ranks, got {len(relative_speeds)}")
    if steps <= WARMUP_STEPS + 2:
        raise ValueError(f"steps must be more than {WARMUP_STEPS + 2} (the first {WARMUP_STEPS} are warm-up)")
    split = proportional_split(global_batch, relative_speeds).per_rank()
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="polychip-balance-") as tmp:
        configs = []
        for rank, share in enumerate(split):
            configs += _configs(f"solo{rank}", [share], WorkloadSpec(steps=steps, global_batch=share), f"{tmp}/solo")
        gang_spec = WorkloadSpec(steps=steps, global_batch=global_batch)
        configs += _configs("gang", split, gang_spec, f"{tmp}/gang")
        # One round of process start-up for solos and gang together (start-up is most of the time).
        # They share the host's cores, which is fair while an emulated step is mostly padding: the
        # padding is measured from the step's start, so extra compute time from sharing is absorbed
        # as long as a step's real compute stays under its padded time (~1 ms of ~30 ms at the
        # defaults); with a much smaller sample_time_ms it would not be.
        runs = run_emulated_ranks(
            configs,
            [*relative_speeds, *relative_speeds],
            sample_time_ms=sample_time_ms,
            workdir=tmp,
            timeout_s=timeout_s,
        )
        solo_runs, gang_runs = runs[: len(split)], runs[len(split) :]
        _check(solo_runs, "solo run")
        _check(gang_runs, "gang run")
        solo = [steady_rate(run.steps, share)[0] for run, share in zip(solo_runs, split, strict=True)]
        gang, timed = steady_rate(gang_runs[0].steps, global_batch)
    return BalanceMeasurement(
        efficiency=gang / sum(solo),
        detail={
            "relative_speeds": list(relative_speeds),
            "micro_batches": list(split),
            "solo_samples_per_s": [round(s, 2) for s in solo],
            "sum_solo_samples_per_s": round(sum(solo), 2),
            "gang_samples_per_s": round(gang, 2),
            "steps_timed": timed,
            "sample_time_ms": sample_time_ms,
            "wall_s": round(time.monotonic() - started, 2),
        },
    )
