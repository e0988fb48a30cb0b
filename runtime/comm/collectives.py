"""Collectives built from counted point-to-point messages (``runtime.comm.transport``).

Every function here is called by each rank of ``members`` (global ranks, in the same order on every
rank) and gives every member the same result, bit for bit: each reduced value is computed once, by
one rank in a fixed order, and then copied.

- ``ring_allreduce``: reduce-scatter then all-gather around the ring, ``2 (L - 1) / L`` of the tensor
  sent per rank; with two members, or a small tensor, directly in one round trip instead. Values
  travel in ``wire_dtype`` and are summed in fp32, so fp16 and bf16 traffic work on any backend.
- ``allgather_bytes``: every member's byte buffer (any length) to every member, ``L - 1`` copies sent
  per rank, directly; each buffer travels behind its 8-byte length.
- ``reduce_to_leader`` / ``broadcast_from_leader``: the two intra-group stages of a hierarchical
  reduction, fp32.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from runtime.comm.codecs import fp16_scale
from runtime.comm.transport import Transport

__all__ = ["DIRECT_MAX_BYTES", "allgather_bytes", "broadcast_from_leader", "reduce_to_leader", "ring_allreduce"]

# Tensors up to this size are all-reduced directly (one round trip, L - 1 copies sent) rather than
# around the ring (2 (L - 1) round trips, 2 (L - 1) / L of the tensor sent): for small tensors the
# round trips, each waiting for a peer to be scheduled, cost more than the bytes.
DIRECT_MAX_BYTES = 256 * 1024


def ring_allreduce(
    transport: Transport, members: Sequence[int], tensor: torch.Tensor, wire_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The SUM of ``tensor`` (fp32, 1-D) over ``members``; returns a new tensor."""
    count = len(members)
    if count == 1:
        return tensor.detach().to(torch.float32).clone()
    # Directly: each member sends L - 1 copies (the ring sends 2 (L - 1) / L of one), so only when the
    # copies are few and small, or when there are two members (then both send one copy).
    if count == 2 or tensor.numel() * wire_dtype.itemsize * (count - 1) <= DIRECT_MAX_BYTES:
        return _direct_allreduce(transport, members, tensor, wire_dtype)
    result = tensor.detach().to(torch.float32).clone()
    me = members.index(transport.rank)
    nxt, prev = members[(me + 1) % count], members[(me - 1) % count]
    chunks = list(torch.tensor_split(result, count))
    # Reduce-scatter: after L - 1 steps this rank holds the full sum of chunk (me + 1) % L.
    for step in range(count - 1):
        out_chunk = chunks[(me - step) % count]
        in_index = (me - step - 1) % count
        incoming = torch.empty(wire_length(chunks[in_index].numel(), wire_dtype), dtype=wire_dtype)
        transport.exchange(nxt, to_wire(out_chunk, wire_dtype), prev, incoming)
        chunks[in_index] += from_wire(incoming, wire_dtype)
    owned = (me + 1) % count
    # All-gather: the finished chunks go around the ring as the owner encoded them, bytes forwarded
    # untouched, and the owner keeps what it sent, so every rank decodes the same bytes.
    wire: dict[int, torch.Tensor] = {owned: to_wire(chunks[owned], wire_dtype)}
    chunks[owned].copy_(from_wire(wire[owned], wire_dtype))
    for step in range(count - 1):
        out_index = (me + 1 - step) % count
        in_index = (me - step) % count
        incoming = torch.empty(wire_length(chunks[in_index].numel(), wire_dtype), dtype=wire_dtype)
        transport.exchange(nxt, wire[out_index], prev, incoming)
        wire[in_index] = incoming
        chunks[in_index].copy_(from_wire(incoming, wire_dtype))
    return result


# An fp16 message carries its power-of-two scale (``fp16_scale``) in its first two slots, the bits of
# one fp32. bf16 has fp32's range and needs none.


def wire_length(numel: int, wire_dtype: torch.dtype) -> int:
    return numel + 2 if wire_dtype == torch.float16 else numel


def to_wire(values: torch.Tensor, wire_dtype: torch.dtype) -> torch.Tensor:
    if wire_dtype != torch.float16:
        return values.to(wire_dtype)
    scale = torch.tensor([fp16_scale(values)], dtype=torch.float32)
    return torch.cat([scale.view(torch.float16), (values * scale).to(torch.float16)])


def from_wire(buffer: torch.Tensor, wire_dtype: torch.dtype) -> torch.Tensor:
    if wire_dtype != torch.float16:
        return buffer.to(torch.float32)
    scale = buffer[:2].view(torch.float32)
    return buffer[2:].to(torch.float32) / scale


def _direct_allreduce(
    transport: Transport, members: Sequence[int], tensor: torch.Tensor, wire_dtype: torch.dtype
) -> torch.Tensor:
    """Each member sends its whole tensor to every other in one round trip; every member sums all of
    them in ``members`` order, so every member gets the same bits."""
    me = transport.rank
    mine = to_wire(tensor.detach().reshape(-1), wire_dtype)
    others = [m for m in members if m != me]
    received = {m: torch.empty(mine.numel(), dtype=wire_dtype) for m in others}
    transport.exchange_many([(m, mine) for m in others], list(received.items()))
    total = torch.zeros(tensor.numel(), dtype=torch.float32)
    for m in members:
        total += from_wire(mine if m == me else received[m], wire_dtype)
    return total


def allgather_bytes(transport: Transport, members: Sequence[int], payload: torch.Tensor) -> list[torch.Tensor]:
    """Every member's ``payload`` (uint8, 1-D, any length), in ``members`` order.

    Direct: each member sends its payload to every other at once (``L - 1`` copies, as many bytes as a
    ring all-gather sends), behind its 8-byte length. Two round trips whatever the number of members,
    where a ring takes ``2 (L - 1)``: on a busy host each round trip waits for a process to be scheduled."""
    me = transport.rank
    others = [m for m in members if m != me]
    sizes = {m: torch.empty(1, dtype=torch.int64) for m in others}
    own_size = torch.tensor([payload.numel()], dtype=torch.int64)
    transport.exchange_many([(m, own_size) for m in others], list(sizes.items()))
    received = {m: torch.empty(int(sizes[m].item()), dtype=torch.uint8) for m in others}
    transport.exchange_many([(m, payload) for m in others], list(received.items()))
    return [payload if m == me else received[m] for m in members]


def reduce_to_leader(transport: Transport, members: Sequence[int], tensor: torch.Tensor) -> torch.Tensor:
    """On the leader (``members[0]``), the SUM over members in member order; elsewhere, ``tensor``."""
    leader = members[0]
    if transport.rank != leader:
        transport.send(leader, tensor)
        return tensor
    total = tensor.detach().to(torch.float32).clone()
    incoming = torch.empty_like(total)
    for member in members[1:]:
        transport.recv(member, incoming)
        total += incoming
    return total


def broadcast_from_leader(transport: Transport, members: Sequence[int], tensor: torch.Tensor) -> torch.Tensor:
    """The leader's ``tensor`` on every member."""
    leader = members[0]
    if transport.rank == leader:
        for member in members[1:]:
            transport.send(member, tensor)
        return tensor
    received = torch.empty_like(tensor)
    transport.recv(leader, received)
    return received
