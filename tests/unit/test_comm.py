"""Gradient codecs: error feedback really keeps what top-k did not send, and bytes are counted honestly."""

from __future__ import annotations

import pytest
import torch

from runtime.comm.codecs import PowerSGDCodec, TopKCodec, index_bytes
from runtime.comm.collectives import from_wire, to_wire


def test_half_precision_wire_sends_half_the_bytes_and_keeps_tiny_gradients():
    grad = torch.randn(1000) * 1e-7  # a mean over a large batch: below fp16's smallest normal
    for dtype in (torch.float16, torch.bfloat16):
        wire = to_wire(grad, dtype)
        # fp16 carries its power-of-two scale in two more slots: 2004 bytes, where fp32 is 4000.
        assert wire.numel() * wire.element_size() == (2004 if dtype == torch.float16 else 2000)
        assert torch.allclose(from_wire(wire, dtype), grad, rtol=1e-2, atol=1e-12)
    assert (grad.half() == 0).sum() > 100  # what a plain cast would have flushed to zero
    assert torch.equal(from_wire(to_wire(torch.zeros(4), torch.float16), torch.float16), torch.zeros(4))


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
    # A 12-byte header, 3 fp16 values (6 bytes) and 3 16-bit gaps (6 bytes): 24 bytes, where dense
    # fp32 is 40,000.
    assert encoded.wire_bytes == 24


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


# -- encodings, layout, buckets, the link throttle and auto: table-driven -------------------------

from runtime.comm.auto import choose_policy, exchange_members, lowrank_factors, lowrank_numbers  # noqa: E402
from runtime.comm.codecs import decode_sparse, encode_sparse  # noqa: E402
from runtime.comm.reducer import Layout, plan_buckets  # noqa: E402
from runtime.comm.transport import LinkThrottle  # noqa: E402
from runtime.jobspec import SpecError, parse_comm  # noqa: E402


@pytest.mark.parametrize(
    ("indices", "numel"),
    [
        ([0, 1, 2, 3], 16),  # bitmap
        ([5, 100, 200], 1_000_000),  # delta16
        ([0, 100, 70_100, 70_200], 1_000_000),  # delta16 with one escaped gap
        # Escaped gaps whose low word is 0xFFFF, the escape marker itself: data, not a marker.
        ([65_535, 65_535 + 0x1FFFF, *range(65_535 + 0x1FFFF + 1, 65_535 + 0x1FFFF + 21)], 2**20),
        (list(range(0, 1_000_000, 100_000)), 1_000_000),  # int32
    ],
)
def test_sparse_payloads_decode_to_what_was_encoded(indices, numel):
    idx = torch.tensor(indices, dtype=torch.int64)
    values = torch.linspace(-3, 3, len(indices))
    payload = encode_sparse(values, idx, numel)
    got_values, got_indices = decode_sparse(payload, numel)
    assert got_indices.tolist() == indices
    assert torch.allclose(got_values, values.half().float())
    assert payload.numel() == 12 + 2 * len(indices) + index_bytes(idx, numel)[0]


@pytest.mark.parametrize(
    ("vendor_groups", "hierarchical", "groups", "used"),
    [
        ((0, 0, 1), True, ((0, 1), (2,)), True),
        ((0, 0, 1), False, ((0,), (1,), (2,)), False),
        ((0, 1, 2), True, ((0,), (1,), (2,)), False),  # every group one rank: nothing to gain
        ((0, 0, 0), True, ((0,), (1,), (2,)), False),  # one group: the policy applies to a flat exchange
        ((1, 0, 1, 0), True, ((0, 2), (1, 3)), True),  # groups numbered by their first rank
    ],
)
def test_layout(vendor_groups, hierarchical, groups, used):
    layout = Layout.of(vendor_groups, hierarchical)
    assert (layout.groups, layout.hierarchical) == (groups, used)
    assert layout.leaders == tuple(g[0] for g in groups)
    # The control plane counts the exchange's members without torch, by the same rule.
    assert exchange_members(vendor_groups, hierarchical) == len(layout.leaders)


def test_the_lowrank_sizes_of_shapes_follow_the_codec():
    shapes = [(64, 32), (64,), (10, 64), (8, 1, 3, 3), (3, 2)]
    matrix, lowrank = lowrank_numbers(shapes, 4)
    worth = [s for s in shapes if PowerSGDCodec.worth_compressing(torch.Size(s), 4)]
    assert worth == [(64, 32), (10, 64), (8, 1, 3, 3)]  # not a vector, nor 3 x 2 at rank 2 (10 > 6)
    assert matrix == 64 * 32 + 10 * 64 + 8 * 9
    assert lowrank == 4 * (64 + 32) + 4 * (10 + 64) + 4 * (8 + 9) + 64 + 6
    assert [PowerSGDCodec.factors(torch.Size(s), 4) for s in shapes] == [lowrank_factors(s, 4) for s in shapes]


def test_buckets_hold_the_last_parameters_first_and_respect_the_size():
    # 4 bytes per entry: 100 KB buckets.
    assert plan_buckets([10_000, 30_000, 5_000, 20_000], 100_000) == [[3, 2], [1], [0]]
    assert plan_buckets([10_000, 30_000, 5_000, 20_000], 240_000) == [[3, 2, 1], [0]]
    assert plan_buckets([1, 2, 3], 10**9) == [[2, 1, 0]]


def test_link_throttle_paces_sends_at_the_configured_rate():
    now = [0.0]
    slept = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    link = LinkThrottle(8e6, burst_bytes=0, clock=lambda: now[0], sleep=sleep)  # 1 MB/s
    for _ in range(4):
        link.consume(250_000)
    assert now[0] == pytest.approx(1.0)  # 1 MB at 1 MB/s
    now[0] += 5.0  # an idle link does not bank more than its burst
    link.consume(500_000)
    assert slept[-1] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="bits_per_s"):
        LinkThrottle(0)


@pytest.mark.parametrize(
    ("gbit", "expected"),
    [
        (100.0, "none"),  # 4.4 MB dense: 0.35 ms, within the 10 ms budget
        (3.0, "fp16"),  # dense 11.7 ms, half of it fits
        (1.0, "powersgd"),  # dense 35 ms; P and Q (80 KB) take 0.6 ms
    ],
)
def test_auto_picks_the_least_lossy_policy_that_fits(gbit, expected):
    params = 1_100_000  # all in matrices
    choice = choose_policy(gbit * 1e9 / 8, params, matrix_params=params, lowrank_params=20_000, members=2)
    assert choice.compression == expected
    assert "Gbit/s" in choice.reason


def test_auto_falls_back_to_topk_when_the_model_is_not_made_of_matrices():
    choice = choose_policy(1e9 / 8, 1_000_000, matrix_params=100_000, lowrank_params=950_000, members=3)
    assert choice.compression == "topk"
    assert 0.01 <= choice.density <= 0.1
    assert choose_policy(1e9 / 8, 1_000_000, matrix_params=0, lowrank_params=0, members=1).compression == "none"


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"compression": "zip"}, "comm.compression"),
        ({"density": 0}, "comm.density"),
        ({"density": 1.5}, "comm.density"),
        ({"rank": 0}, "comm.rank"),
        ({"hierarchical": "yes"}, "comm.hierarchical"),
        ({"bucket_mb": -1}, "comm.bucket_mb"),
        ({"speed": 1}, "comm.speed"),
        ("topk", "comm"),
    ],
)
def test_bad_comm_specs_name_the_field(raw, field):
    with pytest.raises(SpecError) as caught:
        parse_comm(raw)
    assert caught.value.field == field
