"""The gradient exchange on real gloo ranks: hierarchical equals flat, every rank gets the same bits,
error feedback keeps what top-k did not send, and every policy trains a 1M-parameter model."""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from runtime.backends.local import find_free_port
from runtime.backends.local.bench import run_emulated_ranks
from runtime.comm.collectives import ring_allreduce
from runtime.comm.reducer import GradientReducer, Layout
from runtime.comm.transport import Transport
from runtime.jobspec import CommSpec, WorkloadSpec, parse_comm
from runtime.worker import WorkerConfig
from runtime.worker.config import synthetic_mlp_param_count

pytestmark = pytest.mark.runtime

SHAPES = [(64, 48), (48,), (300, 20), (20,), (7, 3, 5)]


def _grads(rank: int, step: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 * rank + step)
    return [torch.randn(shape, generator=generator) for shape in SHAPES]


def _params() -> list[nn.Parameter]:
    return [nn.Parameter(torch.zeros(shape)) for shape in SHAPES]


def _run_reducer(reducer: GradientReducer, params: list[nn.Parameter], grads: list[torch.Tensor]) -> list[torch.Tensor]:
    reducer.begin_step()
    reducer.arm()
    for p, g in zip(params, grads, strict=True):
        assert p.grad is not None
        p.grad.copy_(g)  # as backward accumulates: into the bucket's buffer
    reducer.finish()
    return [p.grad.clone() for p in params if p.grad is not None]


def _worker(rank: int, world: int, port: int, out_dir: str, groups: list[int], scenario: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    try:
        transport = Transport(rank, groups)
        result: dict[str, Any] = {}
        if scenario == "hierarchy":
            for hierarchical in (True, False):
                for overlap in (True, False):
                    params = _params()
                    plan = CommSpec("none", bucket_mb=0.01, overlap=overlap, hierarchical=hierarchical)
                    reducer = GradientReducer(params, plan, transport, Layout.of(groups, hierarchical))
                    before = transport.counters.snapshot()
                    reduced = _run_reducer(reducer, params, _grads(rank, 0))
                    result[f"h{int(hierarchical)}o{int(overlap)}"] = [t.tolist() for t in reduced]
                    result[f"cross_h{int(hierarchical)}o{int(overlap)}"] = transport.counters.since(before).cross_bytes
                    reducer.close()
            flat = []
            for g in _grads(rank, 0):
                t = g.clone()
                dist.all_reduce(t)
                flat.append(t.tolist())
            result["gloo"] = flat
            result["layout"] = [list(g) for g in Layout.of(groups, True).groups]
            # A ring in bf16 works on gloo (which cannot sum bf16) and rounds the same on every rank.
            big = torch.randn(100_003, generator=torch.Generator().manual_seed(rank))  # 400 KB: the ring
            result["ring"] = ring_allreduce(transport, list(range(world)), big).tolist()
            result["ring_fp16"] = ring_allreduce(transport, list(range(world)), big, torch.float16).tolist()
            expected_big = big.clone()
            dist.all_reduce(expected_big)
            result["ring_gloo"] = expected_big.tolist()
            result["bf16"] = ring_allreduce(
                transport, list(range(world)), _grads(rank, 0)[0].reshape(-1), torch.bfloat16
            ).tolist()
        elif scenario == "extras":
            # Per policy and layout: the gradients with extras riding along, and without, from the same
            # inputs; the extras' sums; whether they were folded into the last bucket.
            for compression in ("none", "fp16"):
                for hierarchical in (True, False):
                    for overlap in (True, False):
                        key = f"{compression}-h{int(hierarchical)}o{int(overlap)}"
                        plan = CommSpec(compression, bucket_mb=0.01, overlap=overlap, hierarchical=hierarchical)
                        layout = Layout.of(groups, hierarchical)
                        params = _params()
                        plain = GradientReducer(params, plan, transport, layout)
                        result[f"{key}-plain"] = [t.tolist() for t in _run_reducer(plain, params, _grads(rank, 0))]
                        plain.close()
                        params = _params()
                        fused = GradientReducer(params, plan, transport, layout, extras=world + 1)
                        # One writer per slot (its rank), and a value every rank adds to (the last).
                        extras = torch.zeros(world + 1)
                        extras[rank] = 1000.0 * (rank + 1) + 0.25
                        extras[world] = 2.0**20 + rank  # a fingerprint-sized number: exact in fp32
                        # Ranks that arm with the extras and ranks that give them to finish (no samples).
                        armed = rank % 2 == 0
                        fused.begin_step()
                        fused.arm(extras if armed else None)
                        for p, g in zip(params, _grads(rank, 0), strict=True):
                            assert p.grad is not None
                            p.grad.copy_(g)
                        fused.finish(None if armed else extras)
                        result[f"{key}-fused"] = [p.grad.tolist() for p in params if p.grad is not None]
                        result[f"{key}-sums"] = fused.extras_sum.tolist()
                        result[f"{key}-folded"] = fused.folded
                        fused.close()
        elif scenario == "error_feedback":
            params = _params()
            plan = CommSpec("topk", density=0.05, warmup_steps=0, bucket_mb=0.01, hierarchical=True)
            reducer = GradientReducer(params, plan, transport, Layout.of(groups, True))
            delivered = [torch.zeros(shape) for shape in SHAPES]
            for step in range(30):
                for total, part in zip(delivered, _run_reducer(reducer, params, _grads(rank, step)), strict=True):
                    total += part
            # What waits in each leader's residuals, as a list per bucket, in bucket order.
            residuals = [
                b.codec.residual.tolist() if b.codec and b.codec.residual is not None else None for b in reducer.buckets
            ]
            result = {
                "delivered": [t.tolist() for t in delivered],
                "residuals": residuals,
                "buckets": [
                    [next(i for i, q in enumerate(params) if q is p) for p in b.params] for b in reducer.buckets
                ],
            }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def _spawn(world: int, groups: list[int], scenario: str) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_worker, args=(world, find_free_port(), out, groups, scenario), nprocs=world, join=True)
        return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(world)]


def test_hierarchical_reduction_equals_a_flat_allreduce_and_every_rank_gets_the_same_bits() -> None:
    groups = [0, 0, 1, 1, 1]
    results = _spawn(5, groups, "hierarchy")
    assert results[0]["layout"] == [[0, 1], [2, 3, 4]]
    for variant in ("h1o1", "h1o0", "h0o1", "h0o0"):
        for rank_result in results[1:]:
            assert rank_result[variant] == results[0][variant], f"{variant}: ranks disagree"
        for ours, reference in zip(results[0][variant], results[0]["gloo"], strict=True):
            assert torch.allclose(torch.tensor(ours), torch.tensor(reference), rtol=1e-5, atol=1e-6), variant
    for rank_result in results[1:]:
        assert rank_result["bf16"] == results[0]["bf16"]
        assert rank_result["ring"] == results[0]["ring"]
        assert rank_result["ring_fp16"] == results[0]["ring_fp16"]
    ring, gloo = torch.tensor(results[0]["ring"]), torch.tensor(results[0]["ring_gloo"])
    assert torch.allclose(ring, gloo, rtol=1e-5, atol=1e-5)
    assert torch.allclose(torch.tensor(results[0]["ring_fp16"]), gloo, rtol=1e-2, atol=1e-2)
    expected = sum(_grads(r, 0)[0].reshape(-1) for r in range(5))
    assert torch.allclose(torch.tensor(results[0]["bf16"]), expected, rtol=0.03, atol=0.05)
    # In the hierarchical exchange only the group leaders (ranks 0 and 2) use the cross-group link,
    # each sending one dense copy (two members exchange directly); in the flat one (these buckets are
    # small enough to go directly, every rank to every other) every rank crosses.
    dense = 4 * sum(torch.Size(shape).numel() for shape in SHAPES)
    assert [r["cross_h1o1"] for r in results] == [dense, 0, dense, 0, 0]
    assert all(r["cross_h0o1"] > 0 for r in results)


def test_the_steps_extras_ride_with_the_last_bucket_and_leave_the_gradients_unchanged() -> None:
    """The worker's per-step sums (loss, speeds, split fingerprints, stop flags) travel with the last
    gradient bucket: every rank gets their exact sums, whichever rank wrote them at arm() or at
    finish(), and the gradients are bit for bit those of the exchange without them. With fp32 traffic
    they are folded into that bucket's collective; with fp16 they cannot share its scale and follow it
    in fp32."""
    world, groups = 4, [0, 0, 1, 1]
    results = _spawn(world, groups, "extras")
    expected = [1000.0 * (r + 1) + 0.25 for r in range(world)] + [sum(2.0**20 + r for r in range(world))]
    for compression in ("none", "fp16"):
        for layout in ("h1o1", "h1o0", "h0o1", "h0o0"):
            key = f"{compression}-{layout}"
            for r, rank_result in enumerate(results):
                assert rank_result[f"{key}-sums"] == expected, (key, r)
                assert rank_result[f"{key}-fused"] == rank_result[f"{key}-plain"], (key, r)
                assert rank_result[f"{key}-fused"] == results[0][f"{key}-fused"], (key, r)
                assert rank_result[f"{key}-folded"] is (compression == "none")


def test_error_feedback_delivers_what_topk_held_back() -> None:
    """Summed over steps, what every rank received plus what waits in the leaders' residuals is the
    sum of every rank's gradients: top-k delays entries, it never drops them."""
    groups = [0, 0, 1]
    results = _spawn(3, groups, "error_feedback")
    delivered = [torch.tensor(t) for t in results[0]["delivered"]]
    for other in results[1:]:  # every rank applied the same gradients
        assert all(torch.equal(a, torch.tensor(b)) for a, b in zip(delivered, other["delivered"], strict=True))
    truth = [sum(_grads(r, s)[i] for r in range(3) for s in range(30)) for i in range(len(SHAPES))]
    waiting = [torch.zeros(shape) for shape in SHAPES]
    for leader in (0, 2):
        for bucket, residual in zip(results[leader]["buckets"], results[leader]["residuals"], strict=True):
            flat = torch.tensor(residual)
            offset = 0
            for index in bucket:
                n = waiting[index].numel()
                waiting[index] += flat[offset : offset + n].view_as(waiting[index])
                offset += n
    held_back = sum(float(w.abs().sum()) for w in waiting)
    assert held_back > 1.0  # top-k at 5% really held entries back
    for got, pending, want in zip(delivered, waiting, truth, strict=True):
        assert torch.allclose(got + pending, want, atol=1e-3)


HIDDEN = 1024
POLICIES = {
    "none": {"compression": "none"},
    "fp16": {"compression": "fp16"},
    "bf16": {"compression": "bf16"},
    "topk10": {"compression": "topk", "density": 0.1, "warmup_steps": 5},
    "topk1": {"compression": "topk", "density": 0.01, "warmup_steps": 5},
    "powersgd4": {"compression": "powersgd", "rank": 4},
    "auto": {"compression": "auto"},
}


@pytest.mark.parametrize("policy", list(POLICIES))
def test_each_policy_trains_a_million_parameter_model_on_three_ranks(policy: str, tmp_path: Path) -> None:
    assert synthetic_mlp_param_count(HIDDEN) >= 1_000_000
    workload = WorkloadSpec(steps=30, global_batch=48, lr=0.05, seed=5, hidden=HIDDEN)
    port = find_free_port()
    comm = parse_comm({**POLICIES[policy], "bucket_mb": 1.0})
    configs = [
        WorkerConfig(
            job_id=f"comm-{policy}",
            rank=rank,
            world_size=3,
            master_addr="127.0.0.1",
            master_port=port,
            flavor="cpu",
            device_id=f"cpu/{rank}",
            workload=workload,
            micro_batches=(16, 16, 16),
            artifacts_dir=str(tmp_path / "artifacts"),
            collective_timeout_s=120,
            comm=comm,
            vendor_groups=(0, 0, 1),
        )
        for rank in range(3)
    ]
    runs = run_emulated_ranks(configs, [1.0, 1.0, 1.0], sample_time_ms=0.0, workdir=tmp_path, timeout_s=240)
    assert [r.exit_code for r in runs] == [0, 0, 0], [r.stderr_tail for r in runs]
    losses = [e["loss"] for e in runs[0].steps]
    assert len(losses) == 30
    assert statistics.mean(losses[-5:]) < 0.75 * losses[0], losses
    # Every rank saw the same global loss each step: they trained one model.
    for other in runs[1:]:
        assert [e["loss"] for e in other.steps] == losses
    dense = 4 * synthetic_mlp_param_count(HIDDEN)
    cross = statistics.mean(e["comm_bytes_cross"] for e in runs[0].steps[-5:])  # rank 0 leads group 0
    ceiling = {"none": 1.01, "fp16": 0.51, "bf16": 0.51, "topk10": 0.15, "topk1": 0.05, "powersgd4": 0.05, "auto": 1.01}
    assert 0 < cross <= ceiling[policy] * dense, (policy, cross / dense)
