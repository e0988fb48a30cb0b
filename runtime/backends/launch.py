"""What every backend writes for a job's ranks: each rank's worker config from the launch request.

The backends differ only in where things are (the rendezvous store's address, the files a rank
touches, the link between vendor groups); what a rank is told of its job, its split and its peers is
decided here once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.backends.base import LaunchRequest, vendor_groups
from runtime.balancing import BalancerConfig, BalancingError
from runtime.comm.link import LinkEmulation
from runtime.worker.config import WorkerConfig, initial_split, memory_cap


def check_request(request: LaunchRequest) -> None:
    """``ValueError`` naming the field when a launch request cannot run on any backend."""
    ranks = sorted(p.rank for p in request.placements)
    if ranks != list(range(len(ranks))) or not ranks:
        raise ValueError(f"placements: ranks must be 0..n-1, each once; got {ranks}")
    if request.workload.global_batch < len(ranks):
        raise ValueError(
            f"workload.global_batch ({request.workload.global_batch}) must be at least "
            f"the number of ranks ({len(ranks)})"
        )


def balancing_of(request: LaunchRequest) -> tuple[BalancerConfig, tuple[float, ...], tuple[int | None, ...]]:
    """The worker's balancer config, per-rank scores and memory caps for a launch.

    Scores are the placements' (one unit for the job); when any rank lacks one, every rank scores 1.0,
    so the first split is equal and a dynamic job learns the speeds as it runs. Caps come from each
    device's memory through the synthetic MLP's memory model (``runtime.worker.config.memory_cap``)."""
    placements = sorted(request.placements, key=lambda p: p.rank)
    try:
        config = BalancerConfig(mode=request.balancing)
        caps = tuple(memory_cap(request.workload, p.memory_gib) for p in placements)
    except BalancingError as exc:
        raise ValueError(str(exc)) from None
    given = [p.score for p in placements]
    scores = tuple(float(s) for s in given if s is not None and s > 0)
    if len(scores) != len(placements):
        scores = (1.0,) * len(placements)
    return config, scores, caps


def worker_configs(
    request: LaunchRequest,
    *,
    master_addr: str,
    master_port: int,
    link: LinkEmulation,
    collective_timeout_s: float,
    telemetry_url: str | None,
    files: Callable[[int], dict[str, Any]],
) -> dict[int, dict[str, Any]]:
    """rank -> its worker config as JSON (``WorkerConfig.to_dict``), the rendezvous in a store of its own
    at ``master_addr:master_port``. ``files(rank)``: the backend's paths for that rank
    (``heartbeat_file``, ``control_file``, ``telemetry_file``, ``code_dir``), merged in last."""
    world_size = len(request.placements)
    balancing, scores, caps = balancing_of(request)
    groups = vendor_groups(request.placements)
    micro: tuple[int, ...] = ()
    configs: dict[int, dict[str, Any]] = {}
    for placement in sorted(request.placements, key=lambda p: p.rank):
        rank = placement.rank
        own = files(rank)
        worker = WorkerConfig(
            job_id=request.job_id,
            rank=rank,
            world_size=world_size,
            master_addr=master_addr,
            master_port=master_port,
            flavor=placement.flavor,
            device_id=placement.device_id,
            workload=request.workload,
            micro_batches=micro,
            artifacts_dir=request.artifacts_dir,
            telemetry_url=telemetry_url,
            telemetry_token=request.telemetry_token,
            telemetry_file=own.get("telemetry_file"),
            balancing=balancing,
            scores=scores,
            caps=caps,
            comm=request.comm,
            vendor_groups=groups,
            link=link,
            collective_timeout_s=collective_timeout_s,
            checkpoint=request.checkpoint,
            checkpoint_url=request.checkpoint_url,
            rendezvous="store_host",
            heartbeat_file=own.get("heartbeat_file"),
            control_file=own.get("control_file"),
            code_dir=own.get("code_dir"),
        )
        micro = micro or initial_split(worker).per_rank()
        configs[rank] = {**worker.to_dict(), "micro_batches": list(micro)}
    return configs
