import random

import pytest

from runtime.scheduling import MILLI, NAU, AdmittedJob, FreeDevice, Limit, QuotaLedger, TenantQuota, demand_for


def tenant(tenant_id: int, cohort: str | None = None, *, weight: float = 1.0, **limits: int | Limit) -> TenantQuota:
    """``tenant(1, "lab", h100=4, nau=Limit(8000))``: an int is a nominal quota without other limits."""
    return TenantQuota(
        tenant_id=tenant_id,
        cohort=cohort,
        limits={name: value if isinstance(value, Limit) else Limit(value) for name, value in limits.items()},
        weight=weight,
    )


def ledger(*tenants: TenantQuota, admitted: tuple[AdmittedJob, ...] = ()) -> QuotaLedger:
    return QuotaLedger({t.tenant_id: t for t in tenants}, admitted)


def using(job_id: int, tenant_id: int, **demand: int) -> AdmittedJob:
    return AdmittedJob(job_id, tenant_id, 0, 0.0, (), demand, borrowing=False)


RATES = {("cnn", "h100"): 2500, ("cnn", "a100"): 1000, ("cnn", "tpu"): 1500}


def test_demand_counts_devices_and_sums_nau_over_mixed_flavors():
    assert demand_for("cnn", {"h100": 2, "a100": 3}, RATES) == {"h100": 2, "a100": 3, NAU: 2 * 2500 + 3 * 1000}
    # A pair without a rate is charged one NAU per device; flavors with no devices are not charged.
    assert demand_for("llm", {"h100": 2, "tpu": 0}, RATES) == {"h100": 2, NAU: 2 * MILLI}


@pytest.mark.parametrize(
    ("tenants", "usage", "who", "demand", "fits"),
    [
        # Nominal fits, one more does not (alone, there is nothing to borrow).
        ([tenant(1, h100=4)], {}, 1, {"h100": 4}, True),
        ([tenant(1, h100=4)], {}, 1, {"h100": 5}, False),
        ([tenant(1, h100=4)], {1: {"h100": 3}}, 1, {"h100": 2}, False),
        # Borrowing from the cohort: within the borrowing limit and what the others can lend.
        ([tenant(1, "c", h100=Limit(4, 4)), tenant(2, "c", h100=4)], {}, 1, {"h100": 8}, True),
        ([tenant(1, "c", h100=Limit(4, 2)), tenant(2, "c", h100=4)], {}, 1, {"h100": 7}, False),
        ([tenant(1, "c", h100=Limit(4)), tenant(2, "c", h100=4)], {2: {"h100": 1}}, 1, {"h100": 7}, True),
        ([tenant(1, "c", h100=Limit(4)), tenant(2, "c", h100=4)], {2: {"h100": 1}}, 1, {"h100": 8}, False),
        # The lender's lending limit: only 1 of its 4 may be borrowed.
        ([tenant(1, "c", h100=4), tenant(2, "c", h100=Limit(4, lending_limit=1))], {}, 1, {"h100": 5}, True),
        ([tenant(1, "c", h100=4), tenant(2, "c", h100=Limit(4, lending_limit=1))], {}, 1, {"h100": 6}, False),
        # No cohort: capped at nominal whatever the borrowing limit says.
        ([tenant(1, h100=Limit(4, borrowing_limit=10))], {}, 1, {"h100": 5}, False),
        # A flavor without its own limit is governed by the NAU limit alone.
        ([tenant(1, nau=8000)], {}, 1, {"tpu": 5, NAU: 7500}, True),
        ([tenant(1, nau=8000)], {}, 1, {"tpu": 6, NAU: 9000}, False),
        # Neither a flavor limit nor a NAU limit: the flavor may not be used at all.
        ([tenant(1, h100=4)], {}, 1, {"tpu": 1, NAU: 1000}, False),
        # Resources without a limit are not checked (NAU here).
        ([tenant(1, h100=4)], {}, 1, {"h100": 4, NAU: 10**9}, True),
    ],
)
def test_fits(tenants, usage, who, demand, fits):
    book = ledger(*tenants)
    for tenant_id, held in usage.items():
        book.add(tenant_id, held)
    assert (book.fits(who, demand) is None) == fits


def test_guaranteed_part_never_touches_the_cohort_pool():
    # Tenant 2 lends only 1 of its 4: 3 are guaranteed to it even when the cohort's pool is exhausted.
    book = ledger(tenant(1, "c", h100=4), tenant(2, "c", h100=Limit(4, lending_limit=1)))
    book.add(1, {"h100": 5})  # all of 1's, plus the 1 that 2 lends
    assert book.lendable_free("c", "h100") == 0
    assert book.fits(2, {"h100": 3}) is None
    assert book.fits(2, {"h100": 4}) == (
        "waiting: 0 of 4 h100 in use by your tenant (1 lent to others); cohort has 0 to lend; this job needs 4"
    )


@pytest.mark.parametrize(
    ("tenants", "usage", "demand", "reason"),
    [
        (
            [tenant(1, "c", **{"ascend-910b": 8}), tenant(2, "c", **{"ascend-910b": 4})],
            {1: {"ascend-910b": 6}, 2: {"ascend-910b": 4}},
            {"ascend-910b": 4},
            "waiting: 6 of 8 ascend-910b in use by your tenant; cohort has 0 to lend; this job needs 4",
        ),
        (
            [tenant(1, "c", **{"h100-sxm": Limit(4, 2)}), tenant(2, "c", **{"h100-sxm": 8})],
            {1: {"h100-sxm": 5}},
            {"h100-sxm": 2},
            "would exceed the borrowing limit for h100-sxm (nominal 4 + borrowing limit 2); "
            "5 in use by your tenant, this job needs 2",
        ),
        (
            [tenant(1, "c", **{"h100-sxm": Limit(4, 2)}), tenant(2, "c", **{"h100-sxm": 8})],
            {},
            {"h100-sxm": 7},
            "needs 7 h100-sxm but your tenant may hold at most 6 (nominal 4 + borrowing limit 2)",
        ),
        (
            [tenant(1, h100=4)],
            {},
            {"h100": 5},
            "needs 5 h100 but your tenant may hold at most 4 (nominal 4; no cohort to borrow from)",
        ),
        (
            [tenant(1, h100=4)],
            {1: {"h100": 2}},
            {"h100": 3},
            "waiting: 2 of 4 h100 in use by your tenant; no cohort to borrow from; this job needs 3",
        ),
        (
            [tenant(1, "c", h100=4), tenant(2, "c", h100=Limit(4, lending_limit=2))],
            {},
            {"h100": 7},
            "needs 7 h100 but your tenant may hold at most 6 (nominal 4 + at most 2 lent by cohort c)",
        ),
        (
            [tenant(1, "c", nau=16000), tenant(2, "c", nau=4000)],
            {1: {NAU: 12500}, 2: {NAU: 4000}},
            {"a100": 4, NAU: 4000},
            "waiting: 12.500 of 16.000 NAU in use by your tenant; cohort has 0.000 NAU to lend; this job needs 4.000",
        ),
        ([tenant(1, h100=4)], {}, {"tpu-v4": 1, NAU: 1000}, "no quota for tpu-v4; ask an operator"),
    ],
)
def test_refusals_are_readable_and_specific(tenants, usage, demand, reason):
    book = ledger(*tenants)
    for tenant_id, held in usage.items():
        book.add(tenant_id, held)
    assert book.fits(1, demand) == reason


def test_borrowing_and_nominal_questions():
    book = ledger(tenant(1, "c", h100=4, nau=8000), tenant(2, "c", h100=4))
    book.add(1, {"h100": 3, NAU: 3000})
    assert book.within_nominal(1, {"h100": 1, NAU: 1000})
    assert book.would_borrow(1, {"h100": 2, NAU: 2000})
    assert book.would_borrow(1, {"h100": 1, NAU: 6000})  # NAU above nominal
    assert not book.would_borrow(1, {"tpu": 9})  # no limit: never borrowing
    assert not book.is_borrowing(1)
    book.add(1, {"h100": 2})
    assert book.is_borrowing(1) and book.is_borrowing(1, ["h100"]) and not book.is_borrowing(1, [NAU])
    assert not book.is_borrowing(1, released={"h100": 1})
    assert book.usage(1) == {"h100": 5, NAU: 3000}
    assert book.lendable_free("c", "h100") == 3
    assert book.lendable_free("nowhere", "h100") == 0


def test_admitted_jobs_are_charged_and_can_be_released():
    book = ledger(tenant(1, "c", h100=4), tenant(2, "c", h100=4), admitted=(using(1, 1, h100=6),))
    assert book.lendable_free("c", "h100") == 2
    book.remove(1, {"h100": 6})
    assert book.usage(1)["h100"] == 0 and book.lendable_free("c", "h100") == 8
    with pytest.raises(ValueError, match="releases 1 h100 but uses only 0"):
        book.remove(1, {"h100": 1})


def test_an_unknown_tenant_has_no_quota():
    book = ledger(tenant(1, h100=4))
    assert book.fits(99, {"h100": 1, NAU: 1000}) == "no quota for h100; ask an operator"


def _random_book(rng: random.Random) -> tuple[QuotaLedger, list[int]]:
    resources = ["h100", "a100", NAU]
    tenants = []
    for tenant_id in range(1, rng.randint(2, 6)):
        limits = {}
        for resource in rng.sample(resources, rng.randint(1, 3)):
            nominal = rng.randint(0, 8) * (1000 if resource == NAU else 1)
            limits[resource] = Limit(
                nominal,
                rng.choice([None, 0, 2, 5]) if rng.random() < 0.7 else None,
                rng.choice([None, 0, 1, 3]) if rng.random() < 0.5 else None,
            )
        tenants.append(TenantQuota(tenant_id, rng.choice(["a", "b", None]), limits))
    book = QuotaLedger({t.tenant_id: t for t in tenants})
    for _ in range(rng.randint(0, 12)):  # only admissions that fit: a consistent ledger
        who = rng.choice(tenants).tenant_id
        demand = {rng.choice(resources): rng.randint(1, 3) * (1000 if rng.random() < 0.5 else 1)}
        if book.fits(who, demand) is None:
            book.add(who, demand)
    return book, [t.tenant_id for t in tenants]


def test_headroom_is_exactly_what_fits():
    rng = random.Random(7)
    for _ in range(300):
        book, tenant_ids = _random_book(rng)
        who = rng.choice(tenant_ids)
        for resource in ["h100", "a100", "tpu", NAU]:
            room = book.headroom(who, resource)
            if room is None:
                assert book.fits(who, {resource: 10**9}) is None
                continue
            assert room == 0 or book.fits(who, {resource: room}) is None
            assert book.fits(who, {resource: room + 1}) is not None


def test_hypothetical_headroom_matches_releasing_for_real():
    rng = random.Random(11)
    for _ in range(300):
        book, tenant_ids = _random_book(rng)
        who = rng.choice(tenant_ids)
        # Release part of some tenants' usage: the hypothetical answer must equal the real one.
        releases = {}
        for other in rng.sample(tenant_ids, rng.randint(1, len(tenant_ids))):
            held = book.usage(other)
            releases[other] = {r: rng.randint(0, a) for r, a in held.items() if a > 0}
        relief = {}
        for other, released in releases.items():
            if book.cohort_key(other) == book.cohort_key(who):
                for r, drop in book.relief(other, released).items():
                    relief[r] = relief.get(r, 0) + drop
        for within in (False, True):
            expected = {}
            predicted = {
                r: book.headroom(
                    who, r, within_nominal=within, released=releases.get(who, {}).get(r, 0), relief=relief.get(r, 0)
                )
                for r in ["h100", "a100", NAU]
            }
            for other, released in releases.items():
                book.remove(other, released)
            expected = {r: book.headroom(who, r, within_nominal=within) for r in ["h100", "a100", NAU]}
            for other, released in releases.items():
                book.add(other, released)
            assert predicted == expected


def test_ledger_from_devices_demand():
    devices = (FreeDevice("h-0/0", "h-0", "h100"), FreeDevice("h-0/1", "h-0", "h100"))
    job = AdmittedJob(1, 1, 0, 0.0, devices, demand_for("cnn", {"h100": 2}, RATES), borrowing=False)
    book = ledger(tenant(1, h100=4, nau=10000), admitted=(job,))
    assert book.usage(1) == {"h100": 2, NAU: 5000}
    assert book.headroom(1, NAU) == 5000 and book.headroom(1, "h100") == 2
