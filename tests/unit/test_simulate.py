"""The simulator: its fairness arithmetic and a tiny trace worked by hand."""

from __future__ import annotations

import pytest

from runtime.scheduling import FreeDevice, Limit, TenantQuota
from runtime.simulate import TraceJob, simulate, water_fill


@pytest.mark.parametrize(
    ("capacity", "demand", "weight", "expected"),
    [
        (8, {1: 10, 2: 10}, {}, {1: 4, 2: 4}),  # both want more: halves
        (8, {1: 2, 2: 10}, {}, {1: 2, 2: 6}),  # what one leaves goes to the other
        (8, {1: 0, 2: 3}, {}, {1: 0, 2: 3}),  # nobody gets more than it asks
        (9, {1: 10, 2: 10}, {1: 2.0}, {1: 6, 2: 3}),  # by weight
    ],
)
def test_water_fill(capacity, demand, weight, expected):
    assert water_fill(capacity, demand, weight) == pytest.approx(expected)


def test_a_tiny_trace_by_hand():
    """Two tenants of nominal 2 in a cohort of 4 devices. Tenant 1 asks for 4 devices for 10 s at
    t=0 and borrows tenant 2's half; at t=5 tenant 2 asks for 2 devices for 10 s and reclaims them,
    so tenant 1's job is preempted and (no checkpoint) runs again in full once tenant 2 is done:
    from 15 to 25."""
    pool = [FreeDevice(f"n/{i}", "n", "a100") for i in range(4)]
    tenants = {t: TenantQuota(t, "c", {"a100": Limit(nominal=2)}) for t in (1, 2)}
    trace = [TraceJob(1, 1, 0.0, 4, ("a100",), 10.0), TraceJob(2, 2, 5.0, 2, ("a100",), 10.0)]
    result = simulate(trace, pool, tenants, {}, half_life_s=3600.0)
    assert result.preemptions == 1
    assert result.jct_s == {2: 10.0, 1: 25.0}
    # Held: tenant 1 had 4 devices for 0-5 and 15-25, tenant 2 had 2 for 5-15.
    assert result.device_seconds[1] == pytest.approx(4 * 5 + 4 * 10)
    assert result.device_seconds[2] == pytest.approx(2 * 10)
    # Entitled: 0-5 tenant 1 alone (4); 5-15 both ask, 2 each; 15-25 tenant 1 alone (4).
    assert result.entitled_seconds[1] == pytest.approx(4 * 5 + 2 * 10 + 4 * 10)
    assert result.entitled_seconds[2] == pytest.approx(2 * 10)
    assert result.share_error(2) == 0.0
    assert result.share_error(1) == pytest.approx(abs(60 - 80) / 80)


def test_the_same_trace_gives_the_same_result():
    pool = [FreeDevice(f"n/{i}", "n", "a100") for i in range(8)]
    tenants = {t: TenantQuota(t, "c", {"a100": Limit(nominal=4)}) for t in (1, 2, 3)}
    trace = [TraceJob(i, 1 + i % 3, float(i), 1 + i % 4, ("a100",), 5.0 + i % 7) for i in range(1, 60)]
    first = simulate(trace, pool, tenants, {}, half_life_s=60.0)
    second = simulate(trace, pool, tenants, {}, half_life_s=60.0)
    assert first.jct_s == second.jct_s and first.preemptions == second.preemptions
