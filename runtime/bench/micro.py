"""Micro-benchmarks: what the device (here: the host CPU) does at its simplest.

- ``matmul_tflops``: dense square matmul throughput per dtype;
- ``memory_bandwidth_gbps``: a large tensor copied into another (bytes read + bytes written);
- ``host_device_copy_gbps``: a host tensor moved to the device, from pageable and from pinned memory.

Each runs for a time budget, after warm-up calls (oneDNN picks and caches its kernels on the first
calls of a shape, which would otherwise count), and reports what it measured in ``detail``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
WARMUP_CALLS = 3
MATMUL_MIN_SIZE = 128
MATMUL_MAX_SIZE = 2048


@dataclass(frozen=True)
class Measurement:
    """One figure: ``value`` in ``unit``, or None with ``skipped`` saying why."""

    name: str
    value: float | None
    unit: str
    detail: dict[str, Any] = field(default_factory=dict)
    skipped: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "value": self.value,
            "unit": self.unit,
            "detail": self.detail,
            "skipped": self.skipped,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> Measurement:
        return cls(raw["name"], raw["value"], raw["unit"], dict(raw.get("detail", {})), raw.get("skipped", ""))


def timed_calls(fn: Callable[[], object], budget_s: float, min_calls: int = 3) -> tuple[int, float]:
    """Call ``fn`` (after warm-up) until ``budget_s`` passed and at least ``min_calls`` ran: (calls, seconds)."""
    for _ in range(WARMUP_CALLS):
        fn()
    calls = 0
    started = time.perf_counter()
    while True:
        fn()
        calls += 1
        elapsed = time.perf_counter() - started
        if elapsed >= budget_s and calls >= min_calls:
            return calls, elapsed


def _one_call_s(fn: Callable[[], object], samples: int = 3) -> float:
    """How long one call takes: the fastest of ``samples`` (a single call on a busy host can wait out
    another process's time slice, and would make a size look like it cannot fit the budget)."""
    fn()  # the first call of a shape picks the kernel
    fastest = float("inf")
    for _ in range(samples):
        started = time.perf_counter()
        fn()
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


def _matmul(a: torch.Tensor, b: torch.Tensor) -> Callable[[], object]:
    return lambda: a @ b


def matmul_tflops(dtype: str, budget_s: float = 0.5) -> Measurement:
    """TFLOP/s of ``n x n @ n x n`` in ``dtype`` (2 n^3 FLOP a call).

    The size starts at 128 and doubles while one call takes under a twentieth of the budget (up to
    2048), so a dtype the host has no fast kernels for (fp16 on most CPUs) is measured at a size it
    can finish, not skipped; it is skipped only when even the smallest size does not fit the budget.
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype]
    name = f"matmul_tflops.{dtype}"
    size = MATMUL_MIN_SIZE
    gen = torch.Generator().manual_seed(0)

    def operands(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(n, n, generator=gen).to(torch_dtype), torch.randn(n, n, generator=gen).to(torch_dtype))

    call = _matmul(*operands(size))
    one = _one_call_s(call)
    if one * (WARMUP_CALLS + 3) > budget_s:
        return Measurement(
            name, None, "TFLOP/s", {"size": size}, skipped=f"one {size}x{size} call takes {one * 1000:.0f} ms"
        )
    while size < MATMUL_MAX_SIZE and one * 8 * 20 < budget_s:  # doubling n costs 8x a call
        size *= 2
        call = _matmul(*operands(size))
        one = _one_call_s(call)
    calls, seconds = timed_calls(call, budget_s)
    tflops = 2 * size**3 * calls / seconds / 1e12
    return Measurement(name, tflops, "TFLOP/s", {"size": size, "calls": calls, "seconds": round(seconds, 4)})


def memory_bandwidth_gbps(megabytes: int = 64, budget_s: float = 0.5) -> Measurement:
    """GB/s of ``dst.copy_(src)`` over ``megabytes`` of fp32: each call reads and writes that much.

    64 MB is far beyond the caches of the hosts this runs on, so the figure is DRAM's.
    """
    count = megabytes * 1_000_000 // 4
    src = torch.ones(count, dtype=torch.float32)
    dst = torch.empty_like(src)
    calls, seconds = timed_calls(lambda: dst.copy_(src), budget_s)
    moved = 2 * src.nbytes * calls
    return Measurement(
        "memory_bandwidth_gbps",
        moved / seconds / 1e9,
        "GB/s",
        {"bytes_per_call": 2 * src.nbytes, "calls": calls, "seconds": round(seconds, 4), "counts": "read + write"},
    )


def accelerator() -> torch.device | None:
    """The torch device that stands for an accelerator here, or None on a CPU-only host."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    return None


def host_device_copy_gbps(megabytes: int = 32, budget_s: float = 0.5) -> list[Measurement]:
    """GB/s of moving a host tensor to the device, from pageable memory and from pinned memory.

    With an accelerator this is the host-to-device link (PCIe, NVLink-C2C). On a CPU-only host
    there is no device to copy to: ``tensor.to(device)`` is then a copy into a newly allocated host
    tensor, and that is what is measured (allocation included, the cost a data loader's hand-off
    pays here); pinned memory needs an accelerator, so the pinned figure is skipped and says why.
    """
    count = megabytes * 1_000_000 // 4
    src = torch.ones(count, dtype=torch.float32)
    device = accelerator()
    out: list[Measurement] = []
    if device is None:
        calls, seconds = timed_calls(lambda: src.clone(), budget_s)
        out.append(
            Measurement(
                "host_device_copy_gbps.pageable",
                src.nbytes * calls / seconds / 1e9,
                "GB/s",
                {"what": "host to a new host tensor (no accelerator)", "bytes_per_call": src.nbytes, "calls": calls},
            )
        )
        out.append(
            Measurement(
                "host_device_copy_gbps.pinned", None, "GB/s", skipped="pinned memory needs an accelerator; none here"
            )
        )
        return out

    def to_device(tensor: torch.Tensor) -> Callable[[], object]:
        def copy() -> object:
            moved = tensor.to(device, non_blocking=True)
            torch.cuda.synchronize()
            return moved

        return copy

    for label, tensor in (("pageable", src), ("pinned", src.pin_memory())):
        calls, seconds = timed_calls(to_device(tensor), budget_s)
        out.append(
            Measurement(
                f"host_device_copy_gbps.{label}",
                tensor.nbytes * calls / seconds / 1e9,
                "GB/s",
                {"what": f"host ({label}) to {device}", "bytes_per_call": tensor.nbytes, "calls": calls},
            )
        )
    return out
