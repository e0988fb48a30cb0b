"""Gradient codecs: what a rank puts on the wire, byte for byte, and its error-feedback state.

Pure tensor code (torch and numpy, no process group). The collectives in ``runtime.comm.collectives``
carry what these produce; the bytes they count are the lengths of the very buffers they send.

- fp16 and bf16 need no codec: the collectives send values in that dtype and sum them in fp32, so
  bf16 works on gloo (which cannot sum bf16) as well as on NCCL; ``fp16_scale`` keeps small gradients
  inside fp16's range.
- ``TopKCodec``: the largest-magnitude entries of gradient plus residual, with error feedback (what is
  not sent stays in the residual and goes later) and a warm-up in which the density falls from dense
  to its target (Deep Gradient Compression's schedule). A payload is one byte buffer: a 12-byte
  header (with the values' fp16 scale), the values in fp16, and the indices in the smallest of three
  encodings: a bitmap, 16-bit gaps between successive indices (with an escape for larger gaps), or
  32-bit positions.
- ``PowerSGDCodec``: rank-r approximation P Qᵀ of a matrix-shaped gradient (one power iteration
  warm-started from the last Q), with error feedback; ``reduce`` stands for the SUM all-reduce of P and
  of Q across the ranks that share the codec's state.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from runtime.comm.auto import lowrank_factors

__all__ = [
    "Encoded",
    "PowerSGDCodec",
    "TopKCodec",
    "decode_sparse",
    "encode_sparse",
    "index_bytes",
]

HEADER_BYTES = 12  # encoding (1 byte), 3 spare, k (uint32), the values' scale (float32)
_BITMAP, _DELTA16, _INT32 = 0, 1, 2
_ENCODING_NAMES = {_BITMAP: "bitmap", _DELTA16: "delta16", _INT32: "int32"}
_ESCAPE = 0xFFFF  # in delta16: the next two words are a 32-bit gap (low, high)
FP16_TOP = 16384.0  # where fp16_scale puts the largest value: 2 bits of headroom below 65504
# Top-k estimates its threshold from this many sampled magnitudes when the tensor is larger.
SAMPLE_SIZE = 16_384


@dataclass(frozen=True)
class Encoded:
    """A gradient as it would be sent: what the receiver decodes to, and the bytes on the wire."""

    decoded: torch.Tensor  # what the receiving side reconstructs (float32, the gradient's shape)
    wire_bytes: int
    detail: str = ""


def index_bytes(indices: torch.Tensor, numel: int) -> tuple[int, str]:
    """Bytes to send sorted ``indices`` into a tensor of ``numel`` entries, in the smallest encoding:
    a bitmap (numel / 8), 16-bit gaps (2 bytes each, 4 more for each gap of 65,535 or over), or
    32-bit positions (4 bytes each)."""
    size, kind = _choose_index_encoding(indices, numel)
    return size, _ENCODING_NAMES[kind] if indices.numel() else "none"


def _choose_index_encoding(indices: torch.Tensor, numel: int) -> tuple[int, int]:
    k = indices.numel()
    if k == 0:
        return 0, _INT32
    gaps = torch.diff(indices, prepend=indices.new_zeros(1))
    escapes = int((gaps >= _ESCAPE).sum())
    options = [(math.ceil(numel / 8), _BITMAP), (2 * k + 4 * escapes, _DELTA16), (4 * k, _INT32)]
    return min(options)


def _encode_indices(indices: torch.Tensor, numel: int, kind: int) -> np.ndarray:
    idx = indices.numpy()
    if kind == _BITMAP:
        mask = np.zeros(numel, dtype=np.uint8)
        mask[idx] = 1
        return np.packbits(mask)
    if kind == _INT32:
        return idx.astype("<u4").view(np.uint8)
    gaps = np.diff(idx, prepend=0).astype(np.int64)
    big = gaps >= _ESCAPE
    if not big.any():
        return gaps.astype("<u2").view(np.uint8)
    words = np.empty(len(gaps) + 2 * int(big.sum()), dtype="<u2")
    # Each gap takes one word, an escaped gap three: where each gap's first word lands.
    starts = np.concatenate([[0], np.cumsum(np.where(big, 3, 1))[:-1]])
    words[starts[~big]] = gaps[~big]
    words[starts[big]] = _ESCAPE
    words[starts[big] + 1] = gaps[big] & 0xFFFF
    words[starts[big] + 2] = gaps[big] >> 16
    return words.view(np.uint8)


def _decode_indices(buf: np.ndarray, k: int, numel: int, kind: int) -> np.ndarray:
    if kind == _BITMAP:
        return np.flatnonzero(np.unpackbits(buf, count=numel))
    if kind == _INT32:
        return buf.view("<u4").astype(np.int64)
    words = buf.view("<u2").astype(np.int64)
    keep = np.ones(len(words), dtype=bool)
    values = words.copy()
    skip_until = -1
    # Escape markers are rare; only they are walked in Python. A marker inside an escaped gap's two
    # payload words is data, not a marker, hence skip_until.
    for p in np.flatnonzero(words == _ESCAPE):
        if p <= skip_until:
            continue
        values[p] = words[p + 1] | (words[p + 2] << 16)
        keep[p + 1 : p + 3] = False
        skip_until = int(p) + 2
    gaps = values[keep]
    if len(gaps) != k:
        raise ValueError(f"corrupt sparse payload: {len(gaps)} indices decoded, header says {k}")
    return np.cumsum(gaps)


def fp16_scale(values: torch.Tensor) -> float:
    """A power of two that brings the largest of ``values`` near the top of fp16's range: gradients of
    a mean over a large batch are far below fp16's smallest normal (6e-5) and would lose their digits
    or flush to zero. Scaling by a power of two is exact."""
    peak = float(values.abs().max()) if values.numel() else 0.0
    if not (peak > 0 and math.isfinite(peak)):
        return 1.0
    return 2.0 ** max(-126, min(126, math.floor(math.log2(FP16_TOP / peak))))


def encode_sparse(values: torch.Tensor, indices: torch.Tensor, numel: int) -> torch.Tensor:
    """One uint8 buffer: header, fp16 values (scaled by ``fp16_scale``), then the sorted ``indices``
    in their smallest encoding."""
    k = indices.numel()
    _, kind = _choose_index_encoding(indices, numel)
    header = np.zeros(HEADER_BYTES, dtype=np.uint8)
    header[0] = kind
    header[4:8] = np.array([k], dtype="<u4").view(np.uint8)
    scale = fp16_scale(values)
    header[8:12] = np.array([scale], dtype="<f4").view(np.uint8)
    halves = (values * scale).to(torch.float16).numpy().view(np.uint8)
    body = _encode_indices(indices, numel, kind)
    return torch.from_numpy(np.concatenate([header, halves, body]))


def decode_sparse(payload: torch.Tensor, numel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 values, int64 indices) from an ``encode_sparse`` buffer."""
    buf = payload.numpy()
    kind = int(buf[0])
    k = int(buf[4:8].view("<u4")[0])
    scale = float(buf[8:12].copy().view("<f4")[0])
    end = HEADER_BYTES + 2 * k
    values = torch.from_numpy(buf[HEADER_BYTES:end].copy().view(np.float16)).to(torch.float32) / scale
    indices = torch.from_numpy(_decode_indices(buf[end:].copy(), k, numel, kind))
    return values, indices


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
        self._generator = torch.Generator().manual_seed(0x70F)
        self._magnitudes = torch.empty(0)  # reused: a fresh tensor of millions of entries costs page faults

    def density_at(self, step: int) -> float:
        """Dense at step 0, falling geometrically to ``density`` over the warm-up (DGC's schedule)."""
        if step >= self.warmup_steps:
            return self.density
        return math.pow(self.density, step / self.warmup_steps)

    def compress(self, grad: torch.Tensor) -> torch.Tensor:
        """The payload for ``grad`` plus the residual; the residual keeps the rest for later steps.

        In place over the residual: at millions of entries each full pass over memory costs
        milliseconds, so the accumulation is one pass and the update touches only the k sent."""
        flat = grad.reshape(-1)
        if self.residual is None:
            self.residual = flat.to(torch.float32, copy=True)
        else:
            self.residual.add_(flat)
        accumulated = self.residual
        density = self.density_at(self.step)
        self.step += 1
        k = max(1, math.ceil(density * flat.numel()))
        if self._magnitudes.numel() != accumulated.numel():
            self._magnitudes = torch.empty_like(accumulated)
        indices = self._top_indices(torch.abs(accumulated, out=self._magnitudes), k)
        values = accumulated[indices]
        payload = encode_sparse(values, indices, flat.numel())
        # Error feedback: what was not sent stays; of what was sent, fp16's rounding error stays too.
        scale = fp16_scale(values)
        sent = (values * scale).to(torch.float16).to(torch.float32) / scale
        accumulated.index_put_((indices,), values - sent)
        return payload

    def _top_indices(self, magnitudes: torch.Tensor, k: int) -> torch.Tensor:
        """The sorted positions of the k largest ``magnitudes``, exactly.

        ``torch.topk`` over millions of entries is slow on a CPU (about 0.2 s for 4M), so, as Deep
        Gradient Compression does, a threshold is first estimated from a sample; only the entries
        above it are ranked. When at least k pass, the k largest are all among them, so the result is
        exact; when too few pass, the threshold is lowered."""
        numel = magnitudes.numel()
        if numel <= SAMPLE_SIZE or k * 4 >= numel:
            _, indices = torch.topk(magnitudes, k, sorted=False)
            return torch.sort(indices).values
        sample = magnitudes[torch.randint(numel, (SAMPLE_SIZE,), generator=self._generator)]
        # A quantile somewhat below the target's keeps a margin against sampling error.
        keep = max(1, math.ceil(1.5 * k / numel * SAMPLE_SIZE))
        threshold = torch.kthvalue(sample, SAMPLE_SIZE - keep + 1).values.item()  # the keep-th largest
        for _ in range(8):
            candidates = torch.nonzero(magnitudes >= threshold).flatten()
            if candidates.numel() >= k:
                _, chosen = torch.topk(magnitudes[candidates], k, sorted=False)
                return torch.sort(candidates[chosen]).values
            threshold /= 2
        _, indices = torch.topk(magnitudes, k, sorted=False)
        return torch.sort(indices).values

    def encode(self, grad: torch.Tensor) -> Encoded:
        payload = self.compress(grad)
        numel = grad.numel()
        values, indices = decode_sparse(payload, numel)
        sent = torch.zeros(numel).index_put_((indices,), values)
        kind = _ENCODING_NAMES[int(payload[0])]
        k = int(payload[4:8].numpy().view("<u4")[0])
        return Encoded(sent.reshape(grad.shape), payload.numel(), f"top-{k} of {numel} ({kind} indices)")


class PowerSGDCodec:
    """Rank-r compression of one matrix. With ``reduce`` a SUM across ranks, P Qᵀ approximates the sum
    of the ranks' matrices (both products are linear in the matrix), and every rank's residual keeps
    what its own matrix lost in the projection onto P."""

    def __init__(self, rank: int, *, seed: int = 0, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if rank < 1:
            raise ValueError(f"rank: must be >= 1, got {rank}")
        self.rank = rank
        self.seed = seed
        self.reduce = reduce or (lambda t: t)
        self.q: torch.Tensor | None = None
        self.residual: torch.Tensor | None = None

    @staticmethod
    def factors(shape: torch.Size, rank: int) -> tuple[int, int, int]:
        """(n, m, r): a gradient of any shape as an n x m matrix (the first dimension by the rest),
        and the rank r of its P (n x r) and Q (m x r)."""
        return lowrank_factors(shape, rank)

    @staticmethod
    def worth_compressing(shape: torch.Size, rank: int) -> bool:
        """False when P and Q together would be no smaller than the matrix itself (always so for a
        vector: n x 1 with r = 1)."""
        n, m, r = PowerSGDCodec.factors(shape, rank)
        return r * (n + m) < n * m

    def project(self, grad: torch.Tensor) -> torch.Tensor:
        """Step 1 of 2: this rank's P = (grad + residual) Q, to be SUM-reduced across ranks."""
        n, m, r = self.factors(grad.shape, self.rank)
        matrix = grad.reshape(n, m)
        if self.residual is None:
            self.residual = matrix.to(torch.float32, copy=True)
        else:
            self.residual.add_(matrix)  # the residual becomes this step's target, in place
        if self.q is None:
            generator = torch.Generator().manual_seed(self.seed)
            self.q = torch.randn(m, r, generator=generator)
        return self.residual @ self.q

    def back_project(self, p_sum: torch.Tensor) -> torch.Tensor:
        """Step 2 of 2: orthonormalize the reduced P; returns this rank's Q = targetᵀ P̂, to be SUM-reduced.
        The residual keeps what the projection onto P̂ lost of this rank's own matrix."""
        if self.residual is None:
            raise RuntimeError("back_project before project: there is no target to project back")
        p_hat: torch.Tensor = torch.linalg.qr(p_sum).Q
        self._p = p_hat
        q_local = (p_hat.T @ self.residual).T  # the same as residualᵀ P̂, but a row-major product: 5x faster
        self.residual.addmm_(p_hat, q_local.T, alpha=-1.0)  # target - P̂ P̂ᵀ target, in place
        return q_local

    def finish(self, q_sum: torch.Tensor, shape: torch.Size, out: torch.Tensor | None = None) -> torch.Tensor:
        """The approximation of the sum, P̂ Q_sumᵀ (into ``out``, n x m, when given); Q_sum
        warm-starts the next step."""
        self.q = q_sum.contiguous()
        if out is not None:
            return torch.mm(self._p, q_sum.T, out=out).reshape(shape)
        return (self._p @ q_sum.T).reshape(shape)

    def encode(self, grad: torch.Tensor) -> Encoded:
        """All three steps with ``reduce`` between them (one rank, or a test's stand-in)."""
        if not self.worth_compressing(grad.shape, self.rank):
            return Encoded(grad.clone(), grad.numel() * 4, "dense (too small for low rank)")
        p = self.reduce(self.project(grad))
        q = self.reduce(self.back_project(p))
        approx = self.finish(q, grad.shape)
        n, m, r = self.factors(grad.shape, self.rank)
        return Encoded(approx, (p.numel() + q.numel()) * 4, f"rank {r}: {n}x{r} + {m}x{r}")
