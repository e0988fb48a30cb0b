"""The start forecast (``runtime.simulate.forecast``): a live snapshot played forward by the production
scheduler, on small queues worked by hand."""

from __future__ import annotations

import pytest

from runtime.scheduling import AdmittedJob, FreeDevice, Limit, PendingJob, Snapshot, TenantQuota
from runtime.simulate import TraceJob, Work, forecast_starts, simulate

NOW = 1_000_000.0
DEVICES = [FreeDevice(f"n{i // 2}/{i % 2}", f"n{i // 2}", "a100") for i in range(4)]
TENANTS = {t: TenantQuota(t, None, {"a100": Limit(nominal=4)}) for t in (1, 2)}


def pending(job_id: int, tenant_id: int, devices: int, submitted_at: float = NOW - 100, priority: int = 0):
    return PendingJob(job_id, tenant_id, priority, submitted_at, devices, ("a100",), "synthetic-mlp")


def holding(job_id: int, tenant_id: int, devices: list[FreeDevice]) -> AdmittedJob:
    return AdmittedJob(job_id, tenant_id, 0, NOW - 500, tuple(devices), {"a100": len(devices)}, False)


def snapshot(*, queue, running, free) -> Snapshot:
    return Snapshot(now=NOW, tenants=TENANTS, pending=queue, admitted=running, free=free, nau_rates={})


def test_waiting_jobs_start_as_devices_come_back_smaller_ones_not_held_back():
    """All four devices busy: job 10 (2 devices) ends at +100, job 11 (2) at +300. Tenant 1 waits with
    job 20 (3 devices) first and job 21 (2 devices, 100 samples at 10 samples/s per device: 5 s) behind
    it. Best-effort FIFO, as in admission: 21 takes the two devices freed at +100 rather than wait
    behind 20, and ends at +105; 20 starts at +300, once 11 has ended too."""
    state = snapshot(
        queue=[pending(20, 1, 3), pending(21, 1, 2, submitted_at=NOW - 50)],
        running=[holding(10, 2, DEVICES[:2]), holding(11, 2, DEVICES[2:])],
        free=[],
    )
    forecast = forecast_starts(
        state,
        ends_at={10: NOW + 100, 11: NOW + 300},
        work={20: Work(6000.0, {"a100": 10.0}), 21: Work(100.0, {"a100": 10.0})},
        watch=(20, 21),
    )
    assert forecast.starts == {20: NOW + 300, 21: NOW + 100}
    assert len(forecast.placements[20]) == 3 and len(forecast.placements[21]) == 2
    assert (forecast.ended, forecast.admitted, forecast.endless) == (3, 2, frozenset())


def test_it_agrees_with_the_trace_simulator_on_the_same_queue():
    """The same queue as a trace (everything submitted at once on an idle pool) and as a snapshot: the
    same scheduler gives the same start times."""
    jobs = [(30 + i, 1 + i % 2, 1 + i % 3, 40.0 + 15 * i) for i in range(8)]  # id, tenant, devices, seconds
    trace = [TraceJob(j, t, 0.0, n, ("a100",), s) for j, t, n, s in jobs]
    simulated = simulate(trace, DEVICES, TENANTS, {}, half_life_s=3600.0)
    state = Snapshot(
        now=0.0,
        tenants=TENANTS,
        pending=[PendingJob(j, t, 0, 0.0, n, ("a100",), "synthetic-mlp") for j, t, n, _ in jobs],
        admitted=[],
        free=DEVICES,
        nau_rates={},
    )
    # Seconds on n devices of 1 sample/s each: s * n samples.
    work = {j: Work(s * n, {"a100": 1.0}) for j, _, n, s in jobs}
    forecast = forecast_starts(state, ends_at={}, work=work, watch=[j for j, *_ in jobs])
    for job_id, _, _, seconds in jobs:
        assert forecast.starts[job_id] == pytest.approx(simulated.jct_s[job_id] - seconds)


def test_a_holding_job_with_no_end_keeps_its_devices_and_says_so():
    state = snapshot(queue=[pending(20, 1, 2)], running=[holding(10, 2, DEVICES[:2])], free=DEVICES[2:3])
    forecast = forecast_starts(state, ends_at={10: None}, work={}, watch=(20,))
    assert forecast.starts == {} and forecast.endless == {10} and forecast.cycles == 1
    # A job the replay admits without a speed for its flavor runs without end, too.
    assert Work(10.0, {"h100": 1.0}).seconds_on(DEVICES[:1]) is None


def test_the_horizon_bounds_the_replay():
    state = snapshot(queue=[pending(20, 1, 4)], running=[holding(10, 2, DEVICES[:2])], free=DEVICES[2:])
    forecast = forecast_starts(state, ends_at={10: NOW + 7200}, work={}, watch=(20,), horizon_s=3600)
    assert forecast.starts == {} and forecast.ended == 0
    assert forecast_starts(state, ends_at={10: NOW + 7200}, work={}, watch=(20,)).starts == {20: NOW + 7200}


def test_a_job_that_starts_at_once_starts_now():
    state = snapshot(queue=[pending(20, 1, 2)], running=[], free=DEVICES)
    forecast = forecast_starts(state, ends_at={}, work={}, watch=(20,))
    assert forecast.starts == {20: NOW} and forecast.cycles == 1


def test_a_cycle_or_time_budget_cuts_a_deep_replay_short_and_says_so():
    state = snapshot(
        queue=[pending(20, 1, 3), pending(21, 1, 2, submitted_at=NOW - 50)],
        running=[holding(10, 2, DEVICES[:2]), holding(11, 2, DEVICES[2:])],
        free=[],
    )
    args = {
        "ends_at": {10: NOW + 100, 11: NOW + 300},
        "work": {20: Work(6000.0, {"a100": 10.0}), 21: Work(100.0, {"a100": 10.0})},
        "watch": (20, 21),
    }
    whole = forecast_starts(state, **args)
    assert not whole.cut_short and whole.cycles > 1
    one = forecast_starts(state, **args, max_cycles=1)
    assert one.cut_short and one.cycles == 1 and one.starts == {}
    assert forecast_starts(state, **args, budget_s=0.0).cut_short


def test_an_elastic_borrower_reclaimed_shrinks_and_runs_on_while_the_owner_starts_at_once():
    """Tenant 2 (nominal 0) borrows all four devices with an elastic job that may run on one; tenant 1
    (nominal 4) asks for two. The replay shrinks the borrower to two, as admission would, and the owner
    starts now on the two it gave back; the borrower keeps running on the others until its end."""
    cohort = {
        1: TenantQuota(1, "lab", {"a100": Limit(nominal=4)}),
        2: TenantQuota(2, "lab", {"a100": Limit(nominal=0)}),
    }
    borrower = AdmittedJob(10, 2, 0, NOW - 500, tuple(DEVICES), {"a100": 4}, True, min_devices=1)
    state = Snapshot(now=NOW, tenants=cohort, pending=[pending(20, 1, 2)], admitted=[borrower], free=[], nau_rates={})
    forecast = forecast_starts(state, ends_at={10: NOW + 1000}, work={}, watch=(20,))
    assert forecast.starts == {20: NOW}
    assert forecast.placements[20] == tuple(DEVICES[2:])
    assert forecast.ended == 0  # the borrower was not stopped
