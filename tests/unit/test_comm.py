"""Gradient codecs: error feedback really keeps what top-k did not send, and bytes are counted honestly."""

from __future__ import annotations

import pytest
import torch

from runtime.comm.codecs import CastCodec, PowerSGDCodec, TopKCodec, index_bytes


def test_casts_send_half_the_bytes():
    grad = torch.randn(1000)
    for dtype in (torch.float16, torch.bfloat16):
        encoded = CastCodec(dtype).encode(grad)
        assert encoded.wire_bytes == 2000  # fp32 would be 4000
        assert torch.allclose(encoded.decoded, grad, rtol=1e-2, atol=1e-2)
    with pytest.raises(ValueError, match="dtype"):
        CastCodec(torch.float64)


def test_error_feedback_sends_everything_eventually():
    # Over many steps, what was sent plus what waits in the residual equals everything that came in
    # (up to fp16 rounding, which also goes back into the residual).
    torch.manual_seed(0)
    codec = TopKCodec(0.1)
    total_in = torch.zeros(500)
    total_sent = torch.zeros(500)
    for _ in range(50):
        grad = torch.randn(500)
        total_in += grad
        total_sent += codec.encode(grad).decoded
    assert codec.residual is not None
    assert torch.allclose(total_sent + codec.residual, total_in, atol=1e-4)
    # Nothing is lost: a coordinate that is never large still gets sent once its residual grows.
    stubborn = TopKCodec(0.02)  # two of 100 a step
    grad = torch.full((100,), 0.01)
    grad[0] = 1.0
    sent = sum(stubborn.encode(grad).decoded for _ in range(400))
    assert (sent[1:] > 0).all()


def test_topk_sends_the_largest_entries_and_counts_values_and_indices():
    grad = torch.zeros(10_000)
    grad[[3, 500, 9_999]] = torch.tensor([5.0, -7.0, 2.0])
    encoded = TopKCodec(0.0003).encode(grad)  # k = 3
    assert torch.nonzero(encoded.decoded).flatten().tolist() == [3, 500, 9_999]
    # An 8-byte header, 3 fp16 values (6 bytes) and 3 16-bit gaps (6 bytes): 20 bytes, where dense
    # fp32 is 40,000.
    assert encoded.wire_bytes == 20


@pytest.mark.parametrize(
    ("indices", "numel", "expected"),
    [
        ([0, 1, 2, 3], 16, (2, "bitmap")),  # 16 bits
        ([5, 100, 200], 1_000_000, (6, "delta16")),
        ([0, 100, 70_100, 70_200, 70_300], 1_000_000, (14, "delta16")),  # one gap of 65,535+ escaped: 10 + 4
        ([0, 70_000, 140_000], 1_000_000, (12, "int32")),  # two escapes: 6 + 8 > 12
        (list(range(0, 1_000_000, 100_000)), 1_000_000, (40, "int32")),  # every gap escaped: int32 wins
    ],
)
def test_index_encoding_is_the_smallest_of_three(indices, numel, expected):
    assert index_bytes(torch.tensor(indices), numel) == expected


def test_topk_density_warms_up_from_dense():
    codec = TopKCodec(0.01, warmup_steps=4)
    assert [round(codec.density_at(s), 4) for s in range(6)] == [1.0, 0.3162, 0.1, 0.0316, 0.01, 0.01]
    grad = torch.randn(1000)
    assert codec.encode(grad).wire_bytes > TopKCodec(0.01).encode(grad).wire_bytes  # step 0 is dense


def test_topk_at_ten_percent_sends_under_fifteen_percent_of_the_bytes():
    codec = TopKCodec(0.1)
    grad = torch.randn(1_000_000)
    assert codec.encode(grad).wire_bytes / (grad.numel() * 4) <= 0.15


def test_powersgd_reconstructs_a_low_rank_gradient_and_keeps_the_rest():
    torch.manual_seed(1)
    low_rank = torch.randn(64, 4) @ torch.randn(4, 32)
    codec = PowerSGDCodec(4)
    encoded = codec.encode(low_rank)
    assert torch.allclose(encoded.decoded, low_rank, atol=1e-3)
    assert encoded.wire_bytes == (64 * 4 + 32 * 4) * 4  # P and Q in fp32: 6% of the dense 8 KiB
    # A full-rank gradient: what rank 4 misses stays in the residual (error feedback).
    full = torch.randn(64, 32)
    fresh = PowerSGDCodec(4)
    sent = fresh.encode(full).decoded
    assert fresh.residual is not None
    assert torch.allclose(sent + fresh.residual, full, atol=1e-5)
    # Too small to compress: sent dense.
    assert PowerSGDCodec(4).encode(torch.randn(5)).detail.startswith("dense")
    with pytest.raises(ValueError, match="rank"):
        PowerSGDCodec(0)
