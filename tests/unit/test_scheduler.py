import random
from collections import Counter
from dataclasses import replace

import pytest

from runtime.scheduling import (
    NAU,
    Admission,
    AdmittedJob,
    FreeDevice,
    FreePool,
    Limit,
    PendingJob,
    Preemption,
    QuotaLedger,
    Snapshot,
    TenantQuota,
    Waiting,
    demand_for,
    schedule,
)
from runtime.scheduling.placement import _pack

RATES = {("cnn", "h100"): 2500, ("cnn", "a100"): 1000, ("cnn", "tpu"): 1500}


# --- builders ------------------------------------------------------------------------------------------------


def tenant(tenant_id: int, cohort: str | None = None, *, weight: float = 1.0, **limits: int | Limit) -> TenantQuota:
    """``tenant(1, "lab", h100=4, nau=Limit(8000))``: an int is a nominal quota without other limits."""
    return TenantQuota(
        tenant_id, cohort, {k: v if isinstance(v, Limit) else Limit(v) for k, v in limits.items()}, weight
    )


def devices(flavor: str, node: str, count: int, start: int = 0) -> list[FreeDevice]:
    return [FreeDevice(f"{node}/{i}", node, flavor) for i in range(start, start + count)]


def job(
    job_id: int, tenant_id: int, count: int, *flavors: str, priority: int = 0, at: float | None = None
) -> PendingJob:
    return PendingJob(job_id, tenant_id, priority, float(job_id) if at is None else at, count, flavors, "cnn")


def running(
    job_id: int, tenant_id: int, held: list[FreeDevice], *, priority: int = 0, at: float = 0.0, borrowing: bool = False
) -> AdmittedJob:
    demand = demand_for("cnn", Counter(d.flavor for d in held), RATES)
    return AdmittedJob(job_id, tenant_id, priority, at, tuple(held), demand, borrowing)


def snap(tenants, pending=(), admitted=(), free=(), history=None) -> Snapshot:
    return Snapshot(
        now=1000.0,
        tenants={t.tenant_id: t for t in tenants},
        pending=list(pending),
        admitted=list(admitted),
        free=list(free),
        nau_rates=RATES,
        history=history or {},
    )


def ids(held) -> list[str]:
    return [d.device_id for d in held]


def admitted_ids(result) -> list[int]:
    return [a.job_id for a in result.admissions]


# --- fit and placement ---------------------------------------------------------------------------------------


def test_admits_on_the_preferred_flavor_packed_onto_the_fewest_nodes():
    free = devices("h100", "h-0", 1) + devices("h100", "h-1", 3) + devices("a100", "a-0", 8)
    result = schedule(snap([tenant(1, h100=4, a100=8)], [job(1, 1, 3, "h100", "a100")], free=free))
    assert result.admissions == (
        Admission(1, tuple(devices("h100", "h-1", 3)), {"h100": 3, NAU: 7500}, borrowing=False),
    )
    assert result.waiting == () and result.preemptions == ()


def test_a_gang_is_all_or_nothing_and_smaller_jobs_go_past_it():
    free = devices("h100", "h-0", 2) + devices("tpu", "t-0", 2)
    pending = [job(1, 1, 5, "h100", "tpu", priority=1), job(2, 1, 2, "tpu")]
    result = schedule(snap([tenant(1, h100=8, tpu=8)], pending, free=free))
    assert admitted_ids(result) == [2]
    assert result.waiting == (Waiting(1, "waiting for 5 devices; free now: 2 h100, 2 tpu", 1),)


def test_mixing_flavors_respects_each_flavor_quota_and_charges_nau_per_device():
    free = devices("h100", "h-0", 4) + devices("a100", "a-0", 3)
    result = schedule(snap([tenant(1, h100=2, a100=8)], [job(1, 1, 4, "h100", "a100")], free=free))
    (admission,) = result.admissions
    assert ids(admission.devices) == ["h-0/0", "h-0/1", "a-0/0", "a-0/1"]
    assert admission.demand == {"h100": 2, "a100": 2, NAU: 2 * 2500 + 2 * 1000}


def test_mixing_flavors_governed_by_nau_alone():
    free = devices("h100", "h-0", 2) + devices("tpu", "t-0", 3)
    result = schedule(snap([tenant(1, nau=7000)], [job(1, 1, 4, "tpu", "h100")], free=free))
    (admission,) = result.admissions
    assert admission.demand == {"tpu": 3, "h100": 1, NAU: 3 * 1500 + 2500}


def test_nau_quota_refuses_every_mix_with_a_readable_reason():
    free = devices("h100", "h-0", 2) + devices("tpu", "t-0", 4)
    result = schedule(snap([tenant(1, nau=5500)], [job(1, 1, 4, "tpu", "h100")], free=free))
    assert result.admissions == ()
    assert result.waiting == (
        Waiting(
            1, "needs 6.000 NAU but your tenant may hold at most 5.500 (nominal 5.500; no cohort to borrow from)", 1
        ),
    )


def test_borrowing_within_the_cohort_is_marked():
    tenants = [tenant(1, "c", h100=Limit(2, borrowing_limit=2)), tenant(2, "c", h100=4)]
    result = schedule(snap(tenants, [job(1, 1, 2, "h100"), job(2, 1, 2, "h100")], free=devices("h100", "h-0", 8)))
    assert [(a.job_id, a.borrowing) for a in result.admissions] == [(1, False), (2, True)]


# --- reasons and positions -----------------------------------------------------------------------------------


def test_reasons_and_positions():
    pending = [
        job(1, 1, 3, "h100", priority=5),  # more than the quota ever allows
        job(2, 1, 1, "h100", priority=1),  # admitted
        job(3, 1, 2, "h100"),  # quota is full now
        job(4, 1, 1, "tpu"),  # no quota for the flavor
        job(5, 2, 5, "h100", "tpu"),  # quota would allow h100, but only 3 are free; tpu has room but no quota
    ]
    free = devices("h100", "h-0", 4) + devices("tpu", "t-0", 6)
    result = schedule(snap([tenant(1, h100=2), tenant(2, h100=8)], pending, free=free, history={2: {"h100": 8.0}}))
    assert admitted_ids(result) == [2]
    assert result.waiting == (
        Waiting(1, "needs 3 h100 but your tenant may hold at most 2 (nominal 2; no cohort to borrow from)", 1),
        Waiting(3, "waiting: 1 of 2 h100 in use by your tenant; no cohort to borrow from; this job needs 2", 2),
        Waiting(4, "no quota for tpu; ask an operator", 3),
        # Tenant 2's head fits its nominal quota, so it is decided before tenant 1's borrowing heads.
        Waiting(5, "waiting for 5 devices; free now: 4 h100, 6 tpu; no quota for tpu; ask an operator", 1),
    )


def test_an_unknown_tenant_has_no_quota():
    result = schedule(snap([], [job(1, 7, 1, "h100", "a100")], free=devices("h100", "h-0", 1)))
    assert result.waiting == (Waiting(1, "no quota for h100 or a100; ask an operator", 1),)


# --- fair share ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tenants", "admitted", "history", "first"),
    [
        # Lower current usage first, although tenant 1's job came earlier.
        ([tenant(1, h100=4), tenant(2, h100=4)], [running(9, 1, devices("h100", "x", 1))], {}, 20),
        # History matters.
        ([tenant(1, h100=4), tenant(2, h100=4)], [], {1: {"h100": 2.0}}, 20),
        # Weight divides the share: 1/4 / 4 beats 0.
        ([tenant(1, h100=4, weight=4.0), tenant(2, h100=4)], [running(9, 1, devices("h100", "x", 1))], {}, 20),
        ([tenant(1, h100=4, weight=4.0), tenant(2, h100=4)], [running(9, 2, devices("h100", "x", 1))], {}, 10),
        # Equal shares: the earlier job.
        ([tenant(1, h100=4), tenant(2, h100=4)], [], {}, 10),
    ],
)
def test_the_lowest_dominant_share_goes_first(tenants, admitted, history, first):
    pending = [job(10, 1, 2, "h100", at=1.0), job(20, 2, 2, "h100", at=2.0)]
    result = schedule(snap(tenants, pending, admitted, devices("h100", "h-0", 2), history))
    assert admitted_ids(result) == [first]


def test_equal_shares_go_to_the_higher_priority_head():
    pending = [job(10, 1, 2, "h100", at=1.0), job(20, 2, 2, "h100", at=2.0, priority=3)]
    result = schedule(snap([tenant(1, h100=4), tenant(2, h100=4)], pending, free=devices("h100", "h-0", 2)))
    assert admitted_ids(result) == [20]


def test_shares_are_rekeyed_after_each_admission():
    # Jobs 0, 2, 4 belong to tenant 1's rival (tenant 2 gets the even ids): they alternate, earlier job first.
    pending = [job(i, 2 - i % 2, 1, "h100") for i in range(6)]
    result = schedule(snap([tenant(1, h100=4), tenant(2, h100=4)], pending, free=devices("h100", "h-0", 6)))
    assert admitted_ids(result) == [0, 1, 2, 3, 4, 5]
    assert [pending[i].tenant_id for i in admitted_ids(result)] == [2, 1, 2, 1, 2, 1]


# --- preemption ----------------------------------------------------------------------------------------------


def test_reclaim_takes_back_borrowed_work_whatever_its_priority():
    tenants = [tenant(1, "c", h100=4), tenant(2, "c", h100=2)]
    nominal = running(100, 2, devices("h100", "n-0", 2), priority=9)
    borrowed = running(101, 2, devices("h100", "n-1", 2), priority=9, borrowing=True)
    result = schedule(snap(tenants, [job(1, 1, 4, "h100")], [nominal, borrowed], devices("h100", "n-2", 2)))
    assert result.preemptions == (Preemption(101, 1, "reclaimed by tenant 1 within its nominal quota"),)
    (admission,) = result.admissions
    assert admission.preempts == (101,) and admission.borrowing is False
    assert sorted(ids(admission.devices)) == ["n-1/0", "n-1/1", "n-2/0", "n-2/1"]


def test_priority_preempts_only_borrowed_work_of_strictly_lower_priority():
    tenants = [tenant(1, "c", h100=Limit(4, borrowing_limit=4)), tenant(2, "c", h100=4)]
    admitted = [
        running(100, 1, devices("h100", "n-0", 4)),  # tenant 1's nominal share
        running(101, 1, devices("h100", "n-1", 2), borrowing=True),  # borrowed from tenant 2
        running(102, 2, devices("h100", "n-1", 2, start=2)),
    ]
    result = schedule(snap(tenants, [job(1, 1, 2, "h100", priority=5)], admitted))
    assert result.preemptions == (Preemption(101, 1, "preempted by higher-priority job 1 (priority 5 > 0)"),)
    assert result.admissions[0].preempts == (101,) and result.admissions[0].borrowing is True
    assert ids(result.admissions[0].devices) == ["n-1/0", "n-1/1"]

    same_priority = schedule(snap(tenants, [job(1, 1, 2, "h100")], admitted))
    assert same_priority.admissions == () and same_priority.preemptions == ()


def test_priority_never_evicts_another_tenants_work():
    # Tenant 3 is at its nominal share; its urgent job would borrow. Tenant 2's borrowed job has a
    # lower priority, but it belongs to someone else: priority is no way to take it.
    tenants = [tenant(2, "c", h100=2), tenant(3, "c", h100=2), tenant(4, "c", h100=4)]
    admitted = [
        running(100, 3, devices("h100", "n-0", 2)),
        running(101, 2, devices("h100", "n-1", 4), borrowing=True),
    ]
    result = schedule(snap(tenants, [job(1, 3, 4, "h100", priority=1000)], admitted, devices("h100", "n-2", 2)))
    assert result.preemptions == () and result.admissions == ()


def test_a_pure_borrower_does_not_win_borrowed_capacity_by_having_no_nominal_share():
    # B (nominal 0) already holds 6 borrowed devices; C (nominal 1) holds 1 and asks for one more.
    tenants = [tenant(1, "c", h100=8), tenant(2, "c", h100=0), tenant(3, "c", h100=1)]
    admitted = [
        running(100, 2, devices("h100", "n-0", 6), borrowing=True),
        running(101, 3, devices("h100", "n-1", 1)),
    ]
    pending = [job(1, 2, 1, "h100", at=1.0), job(2, 3, 1, "h100", at=2.0)]
    result = schedule(snap(tenants, pending, admitted, devices("h100", "n-2", 1)))
    assert admitted_ids(result) == [2]


@pytest.mark.parametrize(
    ("tenants", "admitted"),
    [
        # Alone, all of it nominal.
        ([tenant(1, h100=4)], [running(100, 1, devices("h100", "n-0", 4))]),
        # In a cohort: the other tenant's nominal share.
        ([tenant(1, "c", h100=Limit(0, 4)), tenant(2, "c", h100=4)], [running(100, 2, devices("h100", "n-0", 4))]),
        # Marked borrowing when admitted, but its tenant is within nominal now.
        (
            [tenant(1, "c", h100=Limit(0, 4)), tenant(2, "c", h100=4)],
            [running(100, 2, devices("h100", "n-0", 4), borrowing=True)],
        ),
    ],
)
def test_nominal_work_is_never_preempted_even_by_the_highest_priority(tenants, admitted):
    result = schedule(snap(tenants, [job(1, 1, 1, "h100", priority=10**6)], admitted))
    assert result.admissions == () and result.preemptions == ()
    assert len(result.waiting) == 1


def test_the_victim_set_is_minimal():
    tenants = [tenant(1, "c", h100=4), tenant(2, "c", h100=0)]
    admitted = [
        running(101, 2, devices("h100", "n-0", 1), priority=0, at=3.0, borrowing=True),
        running(102, 2, devices("h100", "n-0", 1, start=1), priority=2, at=1.0, borrowing=True),
        running(103, 2, devices("h100", "n-1", 2), priority=1, at=2.0, borrowing=True),
    ]
    result = schedule(snap(tenants, [job(1, 1, 2, "h100")], admitted))
    # Greedy takes 101 (lowest priority) then 103; 103 alone is enough, so 101 is spared.
    assert [p.job_id for p in result.preemptions] == [103]
    assert ids(result.admissions[0].devices) == ["n-1/0", "n-1/1"]


def test_borrowed_work_is_taken_only_down_to_its_tenants_nominal():
    tenants = [tenant(1, "c", h100=4), tenant(2, "c", h100=2), tenant(3, "c", h100=0)]
    admitted = [
        running(101, 2, devices("h100", "n-0", 2), at=2.0, borrowing=True),
        running(102, 2, devices("h100", "n-1", 2), at=1.0, borrowing=True),  # once 101 is gone, this is nominal
        running(103, 3, devices("h100", "n-2", 2), priority=1, borrowing=True),
    ]
    result = schedule(snap(tenants, [job(1, 1, 4, "h100")], admitted))
    assert [p.job_id for p in result.preemptions] == [101, 103]


def test_newest_borrowed_work_goes_first_among_equal_priorities():
    tenants = [tenant(1, "c", h100=2), tenant(2, "c", h100=0), tenant(3, "c", h100=2)]
    admitted = [
        running(101, 2, devices("h100", "n-0", 2), at=1.0, borrowing=True),
        running(102, 2, devices("h100", "n-1", 2), at=5.0, borrowing=True),
    ]
    result = schedule(snap(tenants, [job(1, 1, 2, "h100")], admitted))
    assert [p.job_id for p in result.preemptions] == [102]


def test_devices_freed_by_victims_wait_for_the_next_cycle_unless_the_preemptor_uses_them():
    tenants = [tenant(1, "c", h100=4), tenant(2, "c", h100=0), tenant(3, h100=8)]
    admitted = [running(100, 2, devices("h100", "n-0", 4), borrowing=True)]
    pending = [job(1, 1, 2, "h100"), job(2, 3, 2, "h100")]
    result = schedule(snap(tenants, pending, admitted, history={3: {"h100": 8.0}}))
    assert admitted_ids(result) == [1] and result.admissions[0].preempts == (100,)
    assert result.waiting == (Waiting(2, "waiting for 2 devices; free now: 0 h100", 1),)


def test_a_device_listed_free_but_held_is_taken_as_held():
    holder = running(100, 1, devices("h100", "n-0", 2))
    result = schedule(snap([tenant(1, h100=8)], [job(1, 1, 2, "h100")], [holder], devices("h100", "n-0", 3)))
    assert result.waiting == (Waiting(1, "waiting for 2 devices; free now: 1 h100", 1),)


def test_a_job_owed_its_nominal_share_is_not_lent_away_behind_its_own_tenants_larger_head():
    # Tenant 1's head needs more than it may ever hold; its next job fits its nominal quota and is
    # decided in the first pass, before tenant 2 (lower share, nominal 0) may borrow anything. Had
    # tenant 2 borrowed the devices first, the next cycle would reclaim them: churn for nothing.
    tenants = [tenant(1, "c", h100=4), tenant(2, "c", h100=0)]
    pending = [job(1, 1, 6, "h100", priority=1), job(3, 1, 4, "h100"), job(2, 2, 4, "h100")]
    result = schedule(snap(tenants, pending, free=devices("h100", "n-0", 4), history={1: {"h100": 4.0}}))
    assert [(a.job_id, a.borrowing) for a in result.admissions] == [(3, False)]
    assert result.preemptions == ()
    assert [(w.job_id, w.position) for w in result.waiting] == [(1, 1), (2, 1)]


def test_heads_within_nominal_go_before_borrowers_whatever_the_share():
    # Tenant 2 has the lower share, but its job would borrow; tenant 1's fits its nominal quota.
    tenants = [tenant(1, "c", h100=4), tenant(2, "c", h100=0)]
    pending = [job(1, 1, 4, "h100"), job(2, 2, 4, "h100")]
    result = schedule(snap(tenants, pending, free=devices("h100", "n-0", 4), history={1: {"h100": 4.0}}))
    assert [(a.job_id, a.borrowing) for a in result.admissions] == [(1, False)]


def test_a_job_that_could_only_borrow_now_goes_after_a_job_owed_its_nominal_share():
    # Tenant 3's job fits its nominal a100 quota on paper, but tenant 1 borrows all but one of the
    # cohort's a100s, so now it could only borrow an h100 beside that one. Decided first (lower share),
    # it took the h100 room that tenant 1's job is owed; that job reclaimed it from tenant 2, whose job
    # came back ahead of it in the next cycle, and the two evicted each other cycle after cycle (found by
    # the simulator). It goes with the borrowers now: tenant 1's job takes its h100 first, and then
    # tenant 3's reclaims the a100s that tenant 1 borrows (within nominal: what it is owed).
    tenants = [
        tenant(1, "c", a100=Limit(0, borrowing_limit=4), h100=2),
        tenant(2, "c", a100=3, h100=Limit(0, borrowing_limit=2)),
        tenant(3, "c", weight=2.0, a100=2, h100=0),
        tenant(4, "c", a100=0, h100=1),
    ]
    held_a, held_h = devices("a100", "a-0", 4), devices("h100", "h-0", 2)
    admitted = [running(100, 1, held_a, borrowing=True), running(101, 2, held_h, borrowing=True)]
    pending = [job(4, 1, 1, "h100", priority=5), job(2, 3, 2, "a100", "h100")]
    free = [*held_a, *devices("a100", "a-1", 4), *held_h, *devices("h100", "h-1", 6)]
    result = schedule(snap(tenants, pending, admitted, free))
    assert [(a.job_id, a.borrowing, a.preempts) for a in result.admissions] == [(4, False, ()), (2, False, (100,))]
    assert [p.job_id for p in result.preemptions] == [100]


def test_a_job_that_fits_nominal_only_as_a_mix_is_decided_before_the_borrowers():
    # Tenant 1's 2-device job fits its nominal quota only as 1 h100 + 1 a100 (it already holds an h100
    # of its 2, and its a100 nominal is 1). Counted a borrower (no single flavor fits nominal), it
    # came after tenant 2's borrowing job, which took the room, and then reclaimed it: the same loop.
    tenants = [tenant(1, "c", h100=2, a100=1), tenant(2, "c", weight=2.0, h100=1, a100=1)]
    held = devices("h100", "h-0", 1)
    admitted = [running(100, 1, held)]
    pending = [job(3, 1, 2, "h100", "a100"), job(9, 2, 3, "h100", "a100", priority=5)]
    free = [*held, *devices("h100", "h-1", 4), *devices("a100", "a-0", 4)]
    result = schedule(snap(tenants, pending, admitted, free))
    assert result.admissions[0].job_id == 3 and not result.admissions[0].borrowing
    assert Counter(d.flavor for d in result.admissions[0].devices) == {"h100": 1, "a100": 1}
    assert result.preemptions == ()


def test_cycles_settle_without_preempting_in_a_loop():
    """Small random cohorts (two flavors, quotas below the devices, borrowing limits, priorities) replayed
    cycle after cycle by the simulator, which raises when one instant needs more than 20 cycles. Before the
    first pass admitted within nominal only, seed 7 of these looped."""
    from runtime.simulate import TraceJob, simulate

    looped = []
    for seed in range(40):
        rng = random.Random(seed)
        flavors = ["h100", "a100"]
        pool = [d for f in flavors for n in range(rng.randint(1, 2)) for d in devices(f, f"{f}{n}", rng.choice([4, 8]))]
        count = rng.randint(3, 4)
        tenants = {}
        for t in range(1, count + 1):
            limits = {}
            for f in flavors:
                total = sum(d.flavor == f for d in pool)
                limits[f] = Limit(rng.randint(0, total // count + 1), borrowing_limit=rng.choice([None, None, 2, 4]))
            tenants[t] = TenantQuota(t, "c", limits, rng.choice([1.0, 2.0]))
        trace, at = [], 0.0
        for job_id in range(1, 30):
            at += rng.expovariate(1 / 5)
            allowed = tuple(rng.sample(flavors, rng.randint(1, 2)))
            size = rng.choice([1, 1, 2, 2, 3, 4, 8])
            owner, seconds, priority = rng.randint(1, count), rng.uniform(5, 60), rng.choice([0, 0, 1, 5])
            trace.append(TraceJob(job_id, owner, at, size, allowed, seconds, priority))
        try:
            simulate(trace, pool, tenants, {}, half_life_s=60.0, until_s=2000.0)
        except RuntimeError as error:
            looped.append((seed, str(error)))
    assert looped == []


def test_a_job_owed_its_share_that_waits_for_devices_being_released_keeps_its_quota():
    # Tenant 1 (nominal 4) needs 4; 2 are free and 2 more are still occupied by runs being torn down
    # (its victims, say). Tenant 2 (nominal 0) would borrow the 2 free ones, and be reclaimed next cycle.
    tenants = [tenant(1, "c", h100=4), tenant(2, "c", h100=0)]
    pending = [job(1, 1, 4, "h100"), job(2, 2, 2, "h100")]
    going = devices("h100", "n-0", 2, start=2)
    result = schedule(replace(snap(tenants, pending, free=devices("h100", "n-0", 2)), releasing=going))
    assert result.admissions == ()
    reasons = {w.job_id: w.reason for w in result.waiting}
    assert reasons[1] == "waiting for devices being released (2 h100); its quota is kept for it meanwhile"
    assert "cohort has 0 to lend" in reasons[2]
    # Nothing being released: the borrower may have the free devices (tenant 1's job could not start anyway).
    result = schedule(snap(tenants, pending, free=devices("h100", "n-0", 2)))
    assert [a.job_id for a in result.admissions] == [2]


def elastic(job_id: int, tenant_id: int, low: int, high: int, *flavors: str, priority: int = 0) -> PendingJob:
    return replace(job(job_id, tenant_id, high, *flavors, priority=priority), min_devices=low)


@pytest.mark.parametrize(
    ("free", "admitted"),
    [
        (8, 8),  # the whole range fits: all it asked for
        (5, 5),  # the most that fits
        (2, 2),  # its minimum
        (1, None),  # below its minimum: it waits
    ],
)
def test_an_elastic_job_starts_on_the_most_devices_that_fit_down_to_its_minimum(free, admitted):
    result = schedule(snap([tenant(1, h100=8)], [elastic(1, 1, 2, 8, "h100")], free=devices("h100", "n-0", free)))
    if admitted is None:
        assert result.admissions == ()
        assert result.waiting == (Waiting(1, "waiting for 2 devices; free now: 1 h100", 1),)
    else:
        assert [len(a.devices) for a in result.admissions] == [admitted]
        assert result.admissions[0].demand == demand_for("cnn", {"h100": admitted}, RATES)


def test_an_elastic_job_takes_what_its_quota_allows_and_preempts_only_for_its_minimum():
    # Its quota leaves room for 3 of the 8 it asks for: it starts on 3, borrowing nothing.
    result = schedule(snap([tenant(1, h100=3)], [elastic(1, 1, 2, 8, "h100")], free=devices("h100", "n-0", 8)))
    assert [(len(a.devices), a.borrowing) for a in result.admissions] == [(3, False)]
    # Nothing free: reclaiming from a borrower frees no more than its minimum needs.
    tenants = [tenant(1, "c", h100=4), tenant(2, "c", h100=0)]
    borrowers = [
        running(100, 2, devices("h100", "n-0", 2), borrowing=True, at=1.0),
        running(101, 2, devices("h100", "n-0", 2, start=2), borrowing=True, at=2.0),
    ]
    result = schedule(snap(tenants, [elastic(1, 1, 2, 4, "h100")], borrowers))
    assert [(len(a.devices), a.preempts) for a in result.admissions] == [(2, (101,))]


def elastic_running(job_id: int, tenant_id: int, held: list[FreeDevice], low: int, **kwargs) -> AdmittedJob:
    return replace(running(job_id, tenant_id, held, **kwargs), min_devices=low)


def test_reclaim_shrinks_an_elastic_borrower_by_what_the_owner_needs_and_it_runs_on():
    tenants = [tenant(1, "c", h100=8), tenant(2, "c", h100=0)]
    borrower = elastic_running(100, 2, devices("h100", "n-0", 6), 2, borrowing=True)
    result = schedule(snap(tenants, [job(1, 1, 4, "h100")], [borrower], devices("h100", "n-0", 2, start=6)))
    assert result.preemptions == (
        Preemption(100, 1, "reclaimed by tenant 1 within its nominal quota; shrinks from 6 to 4 devices", keep=4),
    )
    (admission,) = result.admissions
    # The owner takes the two free devices and the two the borrower gives back (its last two).
    assert admission.preempts == (100,)
    assert sorted(ids(admission.devices)) == ["n-0/4", "n-0/5", "n-0/6", "n-0/7"]


def test_an_elastic_borrower_shrinks_no_further_than_its_minimum_else_it_stops():
    tenants = [tenant(1, "c", h100=8), tenant(2, "c", h100=0)]
    borrower = elastic_running(100, 2, devices("h100", "n-0", 6), 5, borrowing=True)
    result = schedule(snap(tenants, [job(1, 1, 4, "h100")], [borrower], devices("h100", "n-0", 2, start=6)))
    # Down to 5 it would free one device; the owner needs two more than are free: it stops whole.
    assert result.preemptions == (Preemption(100, 1, "reclaimed by tenant 1 within its nominal quota"),)


def test_a_shrunk_borrower_can_shrink_again_for_the_next_job_of_the_cycle():
    tenants = [tenant(1, "c", h100=8), tenant(2, "c", h100=0)]
    borrower = elastic_running(100, 2, devices("h100", "n-0", 6), 2, borrowing=True)
    pending = [job(1, 1, 3, "h100"), job(2, 1, 3, "h100")]
    result = schedule(snap(tenants, pending, [borrower], devices("h100", "n-0", 2, start=6)))
    assert [(p.job_id, p.by_job_id, p.keep) for p in result.preemptions] == [(100, 1, 5), (100, 2, 2)]
    # Each owner job gets devices no other holds: 2 free + 1 given back, then 3 more given back.
    first, second = (set(ids(a.devices)) for a in result.admissions)
    assert first == {"n-0/5", "n-0/6", "n-0/7"} and second == {"n-0/2", "n-0/3", "n-0/4"}


def test_an_elastic_borrower_on_a_mix_of_flavors_stops_whole():
    tenants = [tenant(1, "c", h100=4, a100=4), tenant(2, "c", h100=0, a100=0)]
    held = devices("h100", "n-0", 2) + devices("a100", "a-0", 2)
    borrower = elastic_running(100, 2, held, 1, borrowing=True)
    result = schedule(snap(tenants, [job(1, 1, 1, "h100")], [borrower]))
    assert [(p.job_id, p.keep) for p in result.preemptions] == [(100, None)]


def test_a_rigid_borrower_with_a_minimum_for_failures_only_is_never_shrunk():
    # The snapshot gives min_devices only to elastic jobs; a rigid job (min_devices None) stops whole.
    tenants = [tenant(1, "c", h100=8), tenant(2, "c", h100=0)]
    borrower = running(100, 2, devices("h100", "n-0", 6), borrowing=True)
    result = schedule(snap(tenants, [job(1, 1, 4, "h100")], [borrower], devices("h100", "n-0", 2, start=6)))
    assert [(p.job_id, p.keep) for p in result.preemptions] == [(100, None)]


# --- determinism and exactness -------------------------------------------------------------------------------

FLAVORS = ["h100", "a100", "tpu"]


def random_snapshot(rng: random.Random, *, elastic: bool = False) -> Snapshot:
    """A random valid snapshot; ``elastic``: larger running jobs, most of those on one flavor elastic."""
    pool = []
    for flavor in FLAVORS:
        for n in range(rng.randint(0, 3)):
            pool += devices(flavor, f"{flavor}-{n}", rng.randint(1, 5))
    tenants = []
    for tenant_id in range(1, rng.randint(2, 6)):
        limits = {}
        for resource in [*FLAVORS, NAU]:
            if rng.random() < (0.4 if resource == NAU else 0.15):
                continue  # no limit: NAU unchecked; a flavor governed by NAU, or not allowed at all
            scale = 2000 if resource == NAU else 1
            limits[resource] = Limit(
                rng.randint(0, 4) * scale,
                rng.choice([None, 0, 1, 3]) if rng.random() < 0.5 else None,
                rng.choice([None, 0, 1, 2]) if rng.random() < 0.3 else None,
            )
        cohort = rng.choice(["x", "x", "y", None])
        tenants.append(TenantQuota(tenant_id, cohort, limits, weight=rng.choice([1.0, 2.0])))
    quotas = {t.tenant_id: t for t in tenants}
    rates = {(c, f): rng.randint(250, 3000) for c in ("cnn", "llm") for f in FLAVORS if rng.random() < 0.8}
    # Running jobs, admitted as the scheduler would: only when they fit, marked borrowing when above nominal.
    # Most of them belong to a few busy tenants, which borrow what the idle ones lend.
    ledger = QuotaLedger(quotas)
    rng.shuffle(pool)
    admitted = []
    busy = rng.sample(tenants, rng.randint(1, min(2, len(tenants))))
    for job_id in range(1000, 1000 + rng.randint(0, 16)):
        owner = rng.choice(busy if rng.random() < 0.8 else tenants).tenant_id
        if elastic and pool and rng.random() < 0.7:  # mostly gangs of one flavor, which may shrink
            flavor = rng.choice(pool).flavor
            held = [d for d in pool if d.flavor == flavor][: rng.randint(1, 6)]
        else:
            held = pool[: rng.randint(1, 3)]
        demand = demand_for("cnn", Counter(d.flavor for d in held), rates)
        if held and ledger.fits(owner, demand) is None:
            borrowing = ledger.would_borrow(owner, demand)
            ledger.add(owner, demand)
            pool = [d for d in pool if d not in held]
            holder = AdmittedJob(job_id, owner, rng.randint(0, 3), rng.random(), tuple(held), demand, borrowing)
            if elastic and len(held) > 1 and rng.random() < 0.7:
                holder = replace(holder, min_devices=rng.randint(1, len(held) - 1))  # on a mix it stops whole
            admitted.append(holder)
    idle = [t for t in tenants if t not in busy]
    pending = [
        PendingJob(
            job_id,
            rng.choice(idle if idle and rng.random() < 0.7 else tenants).tenant_id,
            rng.randint(0, 5),
            float(rng.randint(0, 5)),
            rng.randint(1, 3),
            tuple(rng.sample(FLAVORS, rng.randint(1, 3))),
            rng.choice(["cnn", "llm"]),
        )
        for job_id in range(1, rng.randint(1, 12))
    ]
    history = {t.tenant_id: {r: rng.random() * 3 for r in FLAVORS} for t in tenants if rng.random() < 0.5}
    return Snapshot(1000.0, quotas, pending, admitted, pool, rates, history)


def test_same_snapshot_same_result_whatever_the_input_order():
    rng = random.Random(3)
    for _ in range(50):
        snapshot = random_snapshot(rng)
        expected = schedule(snapshot)
        assert schedule(snapshot) == expected
        shuffled = replace(
            snapshot,
            pending=rng.sample(list(snapshot.pending), len(snapshot.pending)),
            admitted=rng.sample(list(snapshot.admitted), len(snapshot.admitted)),
            free=rng.sample(list(snapshot.free), len(snapshot.free)),
        )
        assert schedule(shuffled) == expected


def _check_quota(snapshot: Snapshot, holders: list[tuple[int, dict[str, int]]]) -> None:
    """Independent arithmetic: no tenant above nominal + borrowing limit, no cohort above its capacity."""
    usage: dict[int, Counter] = {t: Counter() for t in snapshot.tenants}
    for owner, demand in holders:
        usage[owner].update(demand)
    cohort_usage: Counter = Counter()
    capacity: Counter = Counter()
    for tenant_id, quota in snapshot.tenants.items():
        cohort = quota.cohort or f"alone-{tenant_id}"
        for resource, limit in quota.limits.items():
            used = usage[tenant_id][resource]
            if limit.borrowing_limit is not None:
                assert used <= limit.nominal + limit.borrowing_limit, (tenant_id, resource)
            lendable = limit.nominal if limit.lending_limit is None else min(limit.nominal, limit.lending_limit)
            capacity[cohort, resource] += lendable
            cohort_usage[cohort, resource] += max(0, used - (limit.nominal - lendable))
        for resource, used in usage[tenant_id].items():
            if used and resource != NAU and resource not in quota.limits:
                assert NAU in quota.limits, (tenant_id, resource)
    for key, used in cohort_usage.items():
        assert used <= capacity[key], key


@pytest.mark.parametrize("elastic", [False, True], ids=["rigid", "elastic-victims"])
def test_exactness_on_random_snapshots(elastic):
    rng = random.Random(20260601)
    exercised: Counter = Counter(shrunk=0)
    for _ in range(300):
        snapshot = random_snapshot(rng, elastic=elastic)
        result = schedule(snapshot)
        pending = {j.job_id: j for j in snapshot.pending}
        running_jobs = {a.job_id: a for a in snapshot.admitted}
        _check_quota(snapshot, [(a.tenant_id, dict(a.demand)) for a in snapshot.admitted])  # the set-up is valid

        # Every pending job decided once; positions count each tenant's waiting jobs in queue order.
        decided = [a.job_id for a in result.admissions] + [w.job_id for w in result.waiting]
        assert sorted(decided) == sorted(pending)
        by_tenant: dict[int, list[Waiting]] = {}
        for waiting in result.waiting:
            by_tenant.setdefault(pending[waiting.job_id].tenant_id, []).append(waiting)
        for waits in by_tenant.values():
            assert [w.position for w in waits] == list(range(1, len(waits) + 1))
            order = [(-pending[w.job_id].priority, pending[w.job_id].submitted_at, w.job_id) for w in waits]
            assert order == sorted(order)

        # Victims: borrowed work from the snapshot, in the preemptor's cohort; each stops once, or shrinks
        # (an elastic one on one flavor, never below its minimum) and then maybe shrinks again or stops.
        victims = [p.job_id for p in result.preemptions]
        assert sorted(victims) == sorted(v for a in result.admissions for v in a.preempts)
        holds = {a.job_id: len(a.devices) for a in snapshot.admitted}
        for preemption in result.preemptions:
            assert holds[preemption.job_id] > 0, "a stopped victim preempted again"
            if preemption.keep is not None:
                victim = running_jobs[preemption.job_id]
                assert victim.min_devices is not None and victim.min_devices <= preemption.keep
                assert preemption.keep < holds[preemption.job_id]
                assert len({d.flavor for d in victim.devices}) == 1
                exercised["shrunk"] += 1
            holds[preemption.job_id] = preemption.keep or 0
        for preemption in result.preemptions:
            victim, head = running_jobs[preemption.job_id], pending[preemption.by_job_id]
            assert victim.borrowing
            cohort = snapshot.tenants[head.tenant_id].cohort
            same = victim.tenant_id == head.tenant_id or (
                cohort is not None and snapshot.tenants[victim.tenant_id].cohort == cohort
            )
            assert same
            if preemption.reason.startswith("preempted"):
                assert victim.priority < head.priority
            else:
                assert victim.tenant_id != head.tenant_id

        # Replayed in order, each admission (after its victims stop or shrink) is the gang, on allowed
        # flavors, charged as demand_for says, on devices that are free or that its victims gave back; it
        # keeps every quota, and is marked borrowing exactly when it takes its tenant above nominal. A
        # victim that shrinks keeps its first devices and the same charge per device.
        free_ids = {d.device_id for d in snapshot.free}
        current = {a.job_id: a.devices for a in snapshot.admitted}
        holders = {a.job_id: (a.tenant_id, dict(a.demand)) for a in snapshot.admitted}
        by_preemptor: dict[int, list[Preemption]] = {}
        for preemption in result.preemptions:
            by_preemptor.setdefault(preemption.by_job_id, []).append(preemption)
        for admission in result.admissions:
            head = pending[admission.job_id]
            assert len(admission.devices) == head.devices
            assert {d.flavor for d in admission.devices} <= set(head.flavors)
            counts = Counter(d.flavor for d in admission.devices)
            assert admission.demand == demand_for(head.job_class, counts, snapshot.nau_rates)
            assert [p.job_id for p in by_preemptor.get(admission.job_id, [])] == list(admission.preempts)
            freed: set[str] = set()
            for preemption in by_preemptor.get(admission.job_id, []):
                keep = preemption.keep or 0
                held = current[preemption.job_id]
                freed |= {d.device_id for d in held[keep:]}
                current[preemption.job_id] = held[:keep]
                victim_owner, demand = holders.pop(preemption.job_id)
                if keep:
                    holders[preemption.job_id] = (victim_owner, {r: n // len(held) * keep for r, n in demand.items()})
            assert {d.device_id for d in admission.devices} <= free_ids | freed
            owner = pending[admission.job_id].tenant_id
            held: Counter = Counter()
            for tenant_id, demand in holders.values():
                if tenant_id == owner:
                    held.update(demand)
            limits = snapshot.tenants[owner].limits
            above = any(held[r] + n > limits[r].nominal for r, n in admission.demand.items() if n and r in limits)
            assert admission.borrowing == above
            holders[admission.job_id] = (owner, dict(admission.demand))
            _check_quota(snapshot, list(holders.values()))
        exercised["admitted"] += len(result.admissions)
        exercised["borrowing"] += sum(a.borrowing for a in result.admissions)
        exercised["mixed"] += sum(len({d.flavor for d in a.devices}) > 1 for a in result.admissions)
        exercised["reclaimed"] += sum(p.reason.startswith("reclaimed") for p in result.preemptions)
        exercised["preempted"] += sum(p.reason.startswith("preempted") for p in result.preemptions)

        # After the cycle: no device used twice.
        in_use = [d.device_id for held in current.values() for d in held]
        in_use += [d.device_id for a in result.admissions for d in a.devices]
        assert len(in_use) == len(set(in_use))
    if not elastic:
        assert exercised["shrunk"] == 0  # only elastic jobs shrink
        del exercised["shrunk"]
    # The generator must keep exercising what this test is about.
    # (Priority preemption takes only the tenant's own borrowed work, so it is the rarest.)
    assert min(exercised.values()) >= 5, exercised


# --- the free pool -------------------------------------------------------------------------------------------


def test_the_free_pool_hands_out_what_pack_would():
    rng = random.Random(5)
    for _ in range(100):
        everything = []
        for n in range(rng.randint(1, 6)):
            everything += devices("h100", f"n-{n}", rng.randint(1, 12))
        rng.shuffle(everything)
        pool = FreePool(everything)
        free = list(everything)
        for _ in range(10):
            if rng.random() < 0.6 and free:
                count = rng.randint(1, len(free))
                expected = _pack(free, count)
                assert pool.take("h100", count) == expected
                free = [d for d in free if d not in expected]
            else:
                back = rng.sample(everything, rng.randint(0, min(5, len(everything))))
                pool.put(back)
                free += [d for d in back if d not in free]
            assert pool.count("h100") == len(free)
        with pytest.raises(ValueError, match="free"):
            pool.take("h100", len(free) + 1)


# --- following a placement policy ----------------------------------------------------------------------------


def _flavors_of(result, job_id):
    admission = next(a for a in result.admissions if a.job_id == job_id)
    return Counter(d.flavor for d in admission.devices)


def test_a_policy_puts_each_job_where_its_class_gains_most():
    # Two jobs, one h100 and one a100 free. "cnn" gains 2.5x on h100; "mlp" only 1.2x. Both list a100
    # first: in their own order both want the a100, and the first one gets it. The aware policy gives the
    # h100 to the job that gains most from it, whatever order the jobs listed their flavors in.
    rates = {**RATES, ("mlp", "h100"): 1200, ("mlp", "a100"): 1000}
    free = devices("h100", "h-0", 1) + devices("a100", "a-0", 1)
    pending = [job(1, 1, 1, "a100", "h100"), replace(job(2, 1, 1, "a100", "h100"), job_class="mlp")]
    snapshot = replace(snap([tenant(1, h100=1, a100=1)], pending, free=free), nau_rates=rates)

    own_order = schedule(snapshot)
    assert _flavors_of(own_order, 1) == {"a100": 1} and _flavors_of(own_order, 2) == {"h100": 1}

    from runtime.scheduling.policies import get_policy

    aware = schedule(snapshot, policy=get_policy("aware"))
    assert _flavors_of(aware, 1) == {"h100": 1}
    assert _flavors_of(aware, 2) == {"a100": 1}


def test_a_policy_that_fails_leaves_admission_to_the_jobs_own_order(caplog):
    from runtime.scheduling.policies import SolverError

    class Broken:
        name, aware, mixes = "broken", True, False

        def allocate(self, problem):
            raise SolverError("HiGHS: infeasible")

    free = devices("h100", "h-0", 1)
    result = schedule(snap([tenant(1, h100=1, a100=1)], [job(1, 1, 1, "h100", "a100")], free=free), policy=Broken())
    assert admitted_ids(result) == [1]
    assert "placement policy broken failed" in caplog.text


def test_jobs_of_one_flavor_each_leave_the_policy_nothing_to_order_and_it_is_not_asked():
    class Counting:
        name, aware, mixes = "counting", True, False
        calls = 0

        def allocate(self, problem):
            Counting.calls += 1
            return {j.job_id: {} for j in problem.jobs}

    free = devices("h100", "h-0", 2)
    result = schedule(
        snap([tenant(1, h100=2)], [job(1, 1, 1, "h100"), job(2, 1, 1, "h100")], free=free), policy=Counting()
    )
    assert admitted_ids(result) == [1, 2] and Counting.calls == 0
