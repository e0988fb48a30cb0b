"""Gradient compression: what a rank puts on the wire, and how many bytes that really is.

Pure tensor code (torch, no process group): each codec turns a gradient into what would be sent and
back, keeps its own error-feedback state, and counts the bytes of every tensor it would send, values
and indices both. The collectives that carry the payloads, the hierarchy across vendor groups and the
worker's hook come on top of this (issue 6).

- ``CastCodec``: fp16 or bf16 values (bf16 works anywhere: it is a cast before a plain all-reduce).
- ``TopKCodec``: the largest-magnitude entries of gradient plus residual, with error feedback (what is
  not sent stays in the residual and is sent later) and a warm-up in which the density falls from
  dense to its target. Values go as fp16; indices in the smallest of three encodings: a bitmap,
  16-bit gaps between successive indices (with an escape for larger gaps), or 32-bit positions.
- ``PowerSGDCodec``: rank-r approximation P Qᵀ of each matrix-shaped gradient (one power iteration
  warm-started from the last Q), with error feedback; ``reduce`` stands for the all-reduce of P and Q.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["CastCodec", "Encoded", "PowerSGDCodec", "TopKCodec", "index_bytes"]


@dataclass(frozen=True)
class Encoded:
    """A gradient as it would be sent: what the receiver decodes to, and the bytes on the wire."""

    decoded: torch.Tensor  # what the receiving side reconstructs (float32, the gradient's shape)
    wire_bytes: int
    detail: str = ""


class CastCodec:
    def __init__(self, dtype: torch.dtype) -> None:
        if dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"dtype: cast to float16 or bfloat16, not {dtype}")
        self.dtype = dtype

    def encode(self, grad: torch.Tensor) -> Encoded:
        sent = grad.to(self.dtype)
        return Encoded(sent.to(grad.dtype), sent.numel() * sent.element_size(), f"{self.dtype}")


def index_bytes(indices: torch.Tensor, numel: int) -> tuple[int, str]:
    """Bytes to send sorted ``indices`` into a tensor of ``numel`` entries, in the smallest encoding:
    a bitmap (numel / 8), 16-bit gaps (2 bytes each, plus 4 more for each gap of 65,536 or over), or
    32-bit positions (4 bytes each)."""
    k = indices.numel()
    bitmap = math.ceil(numel / 8)
    if k == 0:
        return 0, "none"
    gaps = torch.diff(indices, prepend=indices.new_zeros(1))
    escapes = int((gaps >= 65536).sum())
    delta = 2 * k + 4 * escapes
    plain = 4 * k
    best = min((bitmap, "bitmap"), (delta, "delta16"), (plain, "int32"))
    return best


class TopKCodec:
    def __init__(self, density: float, *, warmup_steps: int = 0) -> None:
        if not 0 < density <= 1:
            raise ValueError(f"density: must be in (0, 1], got {density}")
        if warmup_steps < 0:
            raise ValueError("warmup_steps: must be >= 0")
        self.density = density
        self.warmup_steps = warmup_steps
        self.step = 0
        self.residual: torch.Tensor | None = None

    def density_at(self, step: int) -> float:
        """Dense at step 0, falling geometrically to ``density`` over the warm-up (DGC's schedule)."""
        if step >= self.warmup_steps:
            return self.density
        return self.density ** (step / self.warmup_steps)

    def encode(self, grad: torch.Tensor) -> Encoded:
        flat = grad.reshape(-1).to(torch.float32)
        if self.residual is None:
            self.residual = torch.zeros_like(flat)
        accumulated = self.residual + flat
        density = self.density_at(self.step)
        self.step += 1
        k = max(1, math.ceil(density * flat.numel()))
        _, indices = torch.topk(accumulated.abs(), k, sorted=False)
        indices, _ = torch.sort(indices)
        values = accumulated[indices].to(torch.float16)  # fp16 values on the wire
        sent = torch.zeros_like(flat)
        sent[indices] = values.to(torch.float32)
        # Error feedback: what was not sent, and what fp16 rounded away, waits for a later step.
        self.residual = accumulated - sent
        idx_bytes, encoding = index_bytes(indices, flat.numel())
        wire = values.numel() * values.element_size() + idx_bytes
        return Encoded(sent.reshape(grad.shape), wire, f"top-{k} of {flat.numel()} ({encoding} indices)")


class PowerSGDCodec:
    def __init__(self, rank: int, *, seed: int = 0, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if rank < 1:
            raise ValueError(f"rank: must be >= 1, got {rank}")
        self.rank = rank
        self.seed = seed
        self.reduce = reduce or (lambda t: t)  # the all-reduce (mean) of P, then of Q, across ranks
        self.q: torch.Tensor | None = None
        self.residual: torch.Tensor | None = None

    @staticmethod
    def as_matrix(shape: torch.Size) -> tuple[int, int]:
        """Gradients of any shape as an n x m matrix: the first dimension by the rest."""
        n = shape[0] if len(shape) else 1
        return n, max(1, math.prod(shape) // max(1, n))

    def encode(self, grad: torch.Tensor) -> Encoded:
        n, m = self.as_matrix(grad.shape)
        matrix = grad.reshape(n, m).to(torch.float32)
        r = min(self.rank, n, m)
        if r * (n + m) >= n * m:  # low rank would not be smaller: send it dense
            return Encoded(grad.clone(), grad.numel() * 4, "dense (too small for low rank)")
        if self.residual is None:
            self.residual = torch.zeros_like(matrix)
        if self.q is None:
            generator = torch.Generator().manual_seed(self.seed)
            self.q = torch.randn(m, r, generator=generator)
        target = matrix + self.residual
        p = self.reduce(target @ self.q)
        p, _ = torch.linalg.qr(p)  # orthonormal columns
        q = self.reduce(target.T @ p)
        approx = p @ q.T
        self.residual = target - approx
        self.q = q
        wire = (p.numel() + q.numel()) * 4
        return Encoded(approx.reshape(grad.shape), wire, f"rank {r}: {n}x{r} + {m}x{r}")
