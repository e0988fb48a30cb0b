"""Collectives built from counted point-to-point messages (``runtime.comm.transport``).

Every function here is called by each rank of ``members`` (global ranks, in the same order on every
rank) and gives every member the same result, bit for bit: each reduced value is computed once, by
one rank in a fixed order, and then copied.

- ``ring_allreduce``: reduce-scatter then all-gather around the ring, ``2 (L - 1) / L`` of the tensor
  sent per rank. Chunks travel in ``wire_dtype`` and are summed in fp32, so fp16 and bf16 traffic
  work on any backend.
- ``ring_allgather``: every member's byte buffer (any length) to every member, ``L - 1`` buffers sent
  per rank; each buffer travels behind its 8-byte length.
- ``reduce_to_leader`` / ``broadcast_from_leader``: the two intra-group stages of a hierarchical
  reduction, fp32.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from runtime.comm.transport import Transport

__all__ = ["broadcast_from_leader", "reduce_to_leader", "ring_allgather", "ring_allreduce"]


def ring_allreduce(
    transport: Transport, members: Sequence[int], tensor: torch.Tensor, wire_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The SUM of ``tensor`` (fp32, 1-D) over ``members``; returns a new tensor."""
    count = len(members)
    result = tensor.detach().to(torch.float32).clone()
    if count == 1:
        return result
    me = members.index(transport.rank)
    nxt, prev = members[(me + 1) % count], members[(me - 1) % count]
    chunks = list(torch.tensor_split(result, count))
    # Reduce-scatter: after L - 1 steps this rank holds the full sum of chunk (me + 1) % L.
    for step in range(count - 1):
        out_chunk = chunks[(me - step) % count]
        in_index = (me - step - 1) % count
        incoming = torch.empty(chunks[in_index].numel(), dtype=wire_dtype)
        transport.exchange(nxt, out_chunk.to(wire_dtype), prev, incoming)
        chunks[in_index] += incoming.to(torch.float32)
    owned = (me + 1) % count
    # The owner keeps what it sends (rounded to the wire dtype), so every rank ends with the same bits.
    chunks[owned].copy_(chunks[owned].to(wire_dtype).to(torch.float32))
    # All-gather: pass the finished chunks around the ring.
    for step in range(count - 1):
        out_chunk = chunks[(me + 1 - step) % count]
        in_index = (me - step) % count
        incoming = torch.empty(chunks[in_index].numel(), dtype=wire_dtype)
        transport.exchange(nxt, out_chunk.to(wire_dtype), prev, incoming)
        chunks[in_index].copy_(incoming.to(torch.float32))
    return result


def ring_allgather(transport: Transport, members: Sequence[int], payload: torch.Tensor) -> list[torch.Tensor]:
    """Every member's ``payload`` (uint8, 1-D, any length), in ``members`` order."""
    count = len(members)
    gathered: list[torch.Tensor | None] = [None] * count
    me = members.index(transport.rank)
    gathered[me] = payload
    nxt, prev = members[(me + 1) % count], members[(me - 1) % count]
    for step in range(count - 1):
        out = gathered[(me - step) % count]
        assert out is not None
        in_index = (me - step - 1) % count
        size = torch.empty(1, dtype=torch.int64)
        transport.exchange(nxt, torch.tensor([out.numel()], dtype=torch.int64), prev, size)
        incoming = torch.empty(int(size.item()), dtype=torch.uint8)
        transport.exchange(nxt, out, prev, incoming)
        gathered[in_index] = incoming
    return [g for g in gathered if g is not None]


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
