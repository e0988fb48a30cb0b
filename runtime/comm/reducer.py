"""The worker's gradient exchange: buckets, the hierarchy across vendor groups, the policy, overlap.

``GradientReducer`` replaces a DDP communication hook in the worker's explicit step:

- Parameters are grouped into buckets of about ``bucket_mb``, last layers first (the order in which
  the backward pass finishes them). With ``overlap`` a background thread reduces each bucket as soon
  as its last gradient is accumulated, while the backward pass computes the rest.
- Each bucket is reduced hierarchically: summed inside each vendor group at its leader, exchanged
  across the group leaders under the job's policy (the slow link, where compression pays), and
  broadcast back inside each group. Without a hierarchy to exploit (``hierarchical: false``, every
  group of one rank, or a single group) the policy applies to one flat exchange among all ranks.
- Policies: dense (``none``, ``fp16``, ``bf16``: a ring all-reduce in that dtype), ``topk`` (sparse
  payloads with error feedback, all-gathered and summed), ``powersgd`` (rank-r P and Q with error
  feedback, ring all-reduced, with the bucket's vectors dense beside the P's).

Every rank ends each step with the same gradient, bit for bit: each sum is computed once and copied.

A step's few other numbers to be summed over the ranks (the worker's loss, speeds, split fingerprints
and stop flags: ``extras``) ride with the last bucket, so that a step makes one exchange, not two: with
fp32 traffic (``none``) they are appended to that bucket's buffer and summed in the same collective,
the gradient entries unchanged (the same sums of the same values); with a compressed or low-precision
policy they cannot share its payload (top-k would drop them, fp16's scale would be set by a split
fingerprint), so they follow it in a small fp32 all-reduce of their own, still in the exchange thread,
overlapped like the buckets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from runtime.comm.codecs import PowerSGDCodec, TopKCodec, decode_sparse
from runtime.comm.collectives import allgather_bytes, broadcast_from_leader, reduce_to_leader, ring_allreduce
from runtime.comm.transport import Transport
from runtime.jobspec import CommSpec

__all__ = ["GradientReducer", "Layout", "StepComm", "plan_buckets", "policy_label"]

REDUCER_THREAD = "grad-reducer"
_CAST = {"none": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def policy_label(plan: CommSpec) -> str:
    """A resolved policy as telemetry and the portal name it, e.g. "topk (density 0.01)"."""
    if plan.compression == "topk":
        return f"topk (density {plan.density:g})"
    if plan.compression == "powersgd":
        return f"powersgd (rank {plan.rank})"
    return plan.compression


@dataclass(frozen=True)
class Layout:
    """Who reduces with whom. ``groups``: the vendor groups' ranks; ``stages`` says whether the
    hierarchy is used (intra-group reduce, cross-group exchange among leaders, intra broadcast)."""

    groups: tuple[tuple[int, ...], ...]
    hierarchical: bool

    @classmethod
    def of(cls, vendor_groups: Sequence[int], hierarchical: bool) -> Layout:
        by_group: dict[int, list[int]] = {}
        for rank, group in enumerate(vendor_groups):
            by_group.setdefault(group, []).append(rank)
        groups = tuple(tuple(ranks) for _, ranks in sorted(by_group.items(), key=lambda kv: kv[1][0]))
        useful = hierarchical and len(groups) > 1 and any(len(g) > 1 for g in groups)
        if not useful:  # flat: every rank takes part in the exchange
            groups = tuple((r,) for r in range(len(vendor_groups)))
        return cls(groups, useful)

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(g[0] for g in self.groups)

    def group_of(self, rank: int) -> tuple[int, ...]:
        return next(g for g in self.groups if rank in g)


def exchange_still_running() -> bool:
    """Whether a gradient exchange thread of this process is alive (inside a collective, after abort)."""
    return any(t.name == REDUCER_THREAD and t.is_alive() for t in threading.enumerate())


def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> list[list[int]]:
    """Parameter indices in buckets of about ``bucket_bytes`` (fp32), last parameter first."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for index in reversed(range(len(sizes))):
        if current and filled + sizes[index] * 4 > bucket_bytes:
            buckets.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index] * 4
    if current:
        buckets.append(current)
    return buckets


@dataclass
class StepComm:
    """One step's exchange, as telemetry reports it."""

    collective_s: float = 0.0  # time spent reducing buckets (compression included)
    exposed_s: float = 0.0  # of which the step waited for after its compute was done

    @property
    def hidden_share(self) -> float:
        if self.collective_s <= 0:
            return 0.0
        return max(0.0, min(1.0, 1.0 - self.exposed_s / self.collective_s))


class _Bucket:
    """Parameters whose gradients travel together. Their ``.grad`` are views into one flat buffer (as
    DDP's ``gradient_as_bucket_view``), so the backward pass accumulates straight into what is sent:
    no copy of millions of entries before each exchange."""

    def __init__(self, params: list[nn.Parameter], room: int = 0) -> None:
        self.params = params
        self.numel = sum(p.numel() for p in params)
        # ``room``: fp32 slots after the gradients, for the step's extras that ride with this bucket.
        self.grads = torch.zeros(self.numel + room)
        self.sums = torch.zeros(0)  # the sparse policies' result, reused from step to step
        self.ready = threading.Event()
        self.pending = len(params)
        self.codec: TopKCodec | None = None
        self.power: list[PowerSGDCodec | None] = []

    def attach(self) -> None:
        """Zero the buffer and point every parameter's ``.grad`` into it (before the backward pass)."""
        self.grads.zero_()
        self._point(self.grads)

    def write_back(self, flat: torch.Tensor) -> None:
        """The exchanged sums become the parameters' gradients, for the optimizer."""
        self._point(flat)

    def _point(self, flat: torch.Tensor) -> None:
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p)
            offset += n


class GradientReducer:
    def __init__(
        self,
        params: Sequence[nn.Parameter],
        plan: CommSpec,
        transport: Transport,
        layout: Layout,
        *,
        seed: int = 0,
        extras: int = 0,
    ) -> None:
        """``plan``: the job's comm spec with ``auto`` already resolved to a policy. ``extras``: how many
        fp32 values each step sums over all ranks beside the gradients (given to ``arm`` or ``finish``,
        read from ``extras_sum``)."""
        self.plan = plan
        self.transport = transport
        self.layout = layout
        self.rank = transport.rank
        self.group = layout.group_of(self.rank)
        self.is_leader = self.group[0] == self.rank
        params = list(params)
        bucket_bytes = max(1, int(plan.bucket_mb * 2**20))
        self.extras = extras
        # Appended to the last bucket only where its exchange is a plain fp32 sum: the other policies
        # compress or scale the payload as a whole (see the module's docstring).
        self.folded = extras > 0 and plan.compression == "none"
        order = plan_buckets([p.numel() for p in params], bucket_bytes)
        self.buckets = [
            _Bucket([params[i] for i in idx], extras if self.folded and b == len(order) - 1 else 0)
            for b, idx in enumerate(order)
        ]
        self._extras_in = torch.zeros(extras)
        self._extras_set = False
        self.extras_sum = torch.zeros(extras)
        if plan.compression == "topk":
            for bucket in self.buckets:
                bucket.codec = TopKCodec(plan.density, warmup_steps=plan.warmup_steps)
        elif plan.compression == "powersgd":
            for b, bucket in enumerate(self.buckets):
                bucket.power = [
                    PowerSGDCodec(plan.rank, seed=seed * 7919 + b * 131 + i)
                    if PowerSGDCodec.worth_compressing(p.shape, plan.rank)
                    else None
                    for i, p in enumerate(bucket.params)
                ]
        self._armed = False
        self._aborted = False
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._stats = StepComm()
        self._thread: threading.Thread | None = None
        self._hooks = []
        if plan.overlap:
            for bucket in self.buckets:
                for p in bucket.params:
                    hook = self._make_hook(bucket)
                    # torch.Tensor.register_post_accumulate_grad_hook has no annotations.
                    self._hooks.append(p.register_post_accumulate_grad_hook(hook))  # type: ignore[no-untyped-call]

    # -- the step ----------------------------------------------------------------------------------

    def begin_step(self) -> None:
        """Before the step's first backward pass."""
        for bucket in self.buckets:
            bucket.ready.clear()
            bucket.pending = len(bucket.params)
            bucket.attach()
        self._armed = False
        self._extras_set = False
        self._stats = StepComm()
        self._error = None
        self._done.clear()
        if self.plan.overlap:
            self._thread = threading.Thread(target=self._reduce_all, name=REDUCER_THREAD, daemon=True)
            self._thread.start()

    def arm(self, extras: torch.Tensor | None = None) -> None:
        """Before the step's last backward pass: from now on a finished gradient is final. ``extras``,
        when known by now, are this rank's values for the step's extras (else give them to ``finish``):
        the last bucket may leave before ``finish``, overlapped with the rest of the step."""
        if extras is not None:
            self._set_extras(extras)
        self._armed = True

    def _set_extras(self, values: torch.Tensor) -> None:
        if values.numel() != self.extras:
            raise ValueError(f"extras: {values.numel()} values given; this exchange carries {self.extras}")
        if self.folded:
            self.buckets[-1].grads[self.buckets[-1].numel :].copy_(values.reshape(-1))
        else:
            self._extras_in.copy_(values.reshape(-1))
        self._extras_set = True

    def _make_hook(self, bucket: _Bucket):  # type: ignore[no-untyped-def]
        def hook(param: nn.Parameter) -> None:
            if self._armed:
                bucket.pending -= 1
                if bucket.pending == 0:
                    bucket.ready.set()

        return hook

    def finish(self, extras: torch.Tensor | None = None) -> StepComm:
        """After the compute (and the step hooks): wait for every bucket; the gradients are then the
        sums over all ranks, and ``extras_sum`` the extras' sums. ``extras``: this rank's values, if
        ``arm`` was not given them (a rank without samples never arms). Returns the step's figures."""
        if self.extras and not self._extras_set:
            if extras is None:
                raise ValueError(f"finish(): this exchange carries {self.extras} extras; give them to arm or finish")
            self._set_extras(extras)
        waited_from = time.monotonic()
        for bucket in self.buckets:  # a rank without samples, or a parameter the loss did not reach
            bucket.ready.set()
        if self.plan.overlap:
            self._done.wait()
            if self._thread is None:
                raise RuntimeError("finish() before begin_step(): no exchange thread to wait for")
            self._thread.join()
        else:
            self._reduce_all()
        if self._error is not None:
            raise self._error
        stats = self._stats
        stats.exposed_s = min(stats.collective_s, time.monotonic() - waited_from)
        return stats

    def abort(self, timeout_s: float = 2.0) -> bool:
        """After a failure mid-step: let the exchange thread stop before the next bucket. Returns False
        when it is still inside a collective (a peer that never answers): the caller must then not
        tear the process group down under it, but leave it to the process's exit."""
        self._aborted = True
        for bucket in self.buckets:
            bucket.ready.set()
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def close(self) -> None:
        """At the end of the run, or after a failure (then the exchange thread is stopped first)."""
        self.abort()
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def _reduce_all(self) -> None:
        try:
            for bucket in self.buckets:  # the same order on every rank
                bucket.ready.wait()
                if self._aborted:
                    return
                started = time.monotonic()
                flat = self._reduce(bucket, bucket.grads)
                if self.folded and bucket is self.buckets[-1]:
                    self.extras_sum = flat[bucket.numel :].clone()
                bucket.write_back(flat)
                self._stats.collective_s += time.monotonic() - started
            if self.extras and not self.folded and not self._aborted:
                started = time.monotonic()
                everyone = list(range(len(self.transport.vendor_groups)))
                self.extras_sum = ring_allreduce(self.transport, everyone, self._extras_in)
                self._stats.collective_s += time.monotonic() - started
        except BaseException as exc:  # surfaced on the main thread by finish()
            self._error = exc
        finally:
            self._done.set()

    # -- one bucket --------------------------------------------------------------------------------

    def _reduce(self, bucket: _Bucket, flat: torch.Tensor) -> torch.Tensor:
        hierarchical = self.layout.hierarchical and len(self.group) > 1
        if hierarchical:
            flat = reduce_to_leader(self.transport, self.group, flat)
        if self.is_leader:
            flat = self._exchange(bucket, flat, list(self.layout.leaders))
        if hierarchical:
            flat = broadcast_from_leader(self.transport, self.group, flat)
        return flat

    def _exchange(self, bucket: _Bucket, flat: torch.Tensor, members: list[int]) -> torch.Tensor:
        """The sum of ``flat`` over ``members`` (the group leaders), under the job's policy."""
        compression = self.plan.compression
        if len(members) == 1:
            return flat
        if compression in _CAST:
            return ring_allreduce(self.transport, members, flat, _CAST[compression])
        if compression == "topk":
            if bucket.codec is None:
                raise RuntimeError("a topk plan with a bucket that has no codec")
            payload = bucket.codec.compress(flat)
            if bucket.sums.numel() != bucket.numel:
                bucket.sums = torch.zeros(bucket.numel)
            total = bucket.sums.zero_()  # the optimizer is done with last step's sums
            for received in allgather_bytes(self.transport, members, payload):  # member order: same sums
                values, indices = decode_sparse(received, bucket.numel)
                total.index_add_(0, indices, values)
            return total
        if compression == "powersgd":
            return self._powersgd(bucket, flat, members)
        raise ValueError(f"compression: {compression!r} is not a resolved policy")

    def _powersgd(self, bucket: _Bucket, flat: torch.Tensor, members: list[int]) -> torch.Tensor:
        views: list[torch.Tensor] = []
        offset = 0
        for p in bucket.params:
            views.append(flat[offset : offset + p.numel()].view(p.shape))
            offset += p.numel()
        dense = [v.reshape(-1) for v, codec in zip(views, bucket.power, strict=True) if codec is None]
        projections = [
            codec.project(v).reshape(-1) for v, codec in zip(views, bucket.power, strict=True) if codec is not None
        ]
        # One message for the P's and the uncompressed vectors, a second for the Q's.
        first = ring_allreduce(self.transport, members, torch.cat([*projections, *dense]))
        q_parts: list[torch.Tensor] = []
        cursor = 0
        for v, codec in zip(views, bucket.power, strict=True):
            if codec is None:
                continue
            n, _, r = PowerSGDCodec.factors(v.shape, codec.rank)
            p_sum = first[cursor : cursor + n * r].view(n, r)
            cursor += n * r
            q_parts.append(codec.back_project(p_sum).reshape(-1))
        dense_sum = first[cursor:]
        q_sum = ring_allreduce(self.transport, members, torch.cat(q_parts)) if q_parts else torch.zeros(0)
        out = torch.empty_like(flat)
        offset = q_offset = dense_offset = 0
        for v, codec in zip(views, bucket.power, strict=True):
            n = v.numel()
            if codec is None:
                out[offset : offset + n] = dense_sum[dense_offset : dense_offset + n]
                dense_offset += n
            else:
                rows, m, r = PowerSGDCodec.factors(v.shape, codec.rank)
                q = q_sum[q_offset : q_offset + m * r].view(m, r)
                q_offset += m * r
                codec.finish(q, v.shape, out=out[offset : offset + n].view(rows, m))
            offset += n
        return out
