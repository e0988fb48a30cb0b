"""Where a job goes after a failure: survivors first, then its flavors, then the others it allows."""

from __future__ import annotations

import pytest

from runtime.recovery.plan import RestartRequest, grow_target, plan_restart, worth_growing
from runtime.scheduling.placement import FreeDevice


def dev(device_id: str, flavor: str | None = None, node: str | None = None) -> FreeDevice:
    flavor = flavor or device_id.split("/")[0]
    return FreeDevice(device_id=device_id, node=node or device_id.rsplit("/", 1)[0], flavor=flavor)


H0, H1, H2 = dev("h100/0"), dev("h100/1"), dev("h100/2")
A0, A1 = dev("a100/0"), dev("a100/1")
T0 = dev("tpu/0")


def request(devices=3, min_devices=None, flavors=("h100", "a100"), previous=(H0, H1, H2), failed=()):
    return RestartRequest(
        devices=devices,
        min_devices=min_devices or devices,
        flavors=flavors,
        previous=previous,
        failed=frozenset(failed),
    )


@pytest.mark.parametrize(
    ("name", "req", "free", "want_ids", "kept", "same", "other", "shrunk"),
    [
        # H1 failed (not free any more); a spare h100 replaces it like for like.
        (
            "same flavor first",
            request(previous=(H0, H1, dev("h100/3"))),
            [H0, dev("h100/3"), H2, A0],
            ["h100/0", "h100/3", "h100/2"],
            2,
            1,
            0,
            0,
        ),
        # No spare h100: an a100, which the spec allows, takes its place.
        ("then any allowed flavor", request(), [H0, H2, A0, T0], ["h100/0", "h100/2", "a100/0"], 2, 0, 1, 0),
        # A tpu is free but not allowed; the job shrinks to what it accepts.
        ("shrink to min_devices", request(min_devices=2), [H0, H2, T0], ["h100/0", "h100/2"], 2, 0, 0, 1),
        # A device marked failed is never used again, even if it shows as free.
        (
            "failed devices excluded",
            request(failed=["h100/1"]),
            [H0, H1, H2, A0],
            ["h100/0", "h100/2", "a100/0"],
            2,
            0,
            1,
            0,
        ),
        # Everything new: the previous devices were taken meanwhile.
        ("no survivors", request(devices=2, previous=(H0, H1)), [A0, A1, H2], ["h100/2", "a100/0"], 0, 1, 1, 0),
    ],
)
def test_plan_restart(name, req, free, want_ids, kept, same, other, shrunk):
    plan = plan_restart(req, free)
    assert plan is not None, name
    assert sorted(d.device_id for d in plan.devices) == sorted(want_ids), name
    assert [d.device_id for d in plan.devices[:kept]] == [d.device_id for d in req.previous if d.device_id in want_ids][
        :kept
    ]
    assert (plan.kept, plan.same_flavor, plan.other_flavor, plan.shrunk_by) == (kept, same, other, shrunk), name


def test_below_min_devices_the_job_waits():
    assert plan_restart(request(min_devices=3), [H0, T0]) is None


def test_the_description_says_what_happened():
    plan = plan_restart(request(min_devices=1), [H0, A0])
    assert plan is not None
    assert plan.describe() == "2 device(s): 1 kept, 1 of another allowed flavor; shrunk by 1 until devices return"


def test_min_devices_outside_the_size_is_refused():
    with pytest.raises(ValueError, match="min_devices"):
        plan_restart(request(devices=2, min_devices=3), [H0])


@pytest.mark.parametrize(
    ("current", "devices", "free", "target"),
    [(1, 2, 1, 2), (1, 4, 2, 3), (2, 2, 5, None), (1, 3, 0, None), (2, 4, 9, 4)],
)
def test_grow_target(current, devices, free, target):
    assert grow_target(current, devices, free) == target


@pytest.mark.parametrize(
    ("steps_left", "now_s", "after_s", "cost_s", "grow"),
    [
        (100, 0.6, 0.2, 30.0, True),  # 40 s saved for a 30 s move
        (50, 0.6, 0.2, 30.0, False),  # 20 s saved
        (75, 0.6, 0.2, 30.0, False),  # exactly even: not worth the risk of a move
        (1000, 0.6, 0.6, 0.0, False),  # no faster: never
        (10, 0.0, 0.0, 30.0, True),  # no speed measured yet: not judged
    ],
)
def test_a_move_is_worth_it_only_when_the_faster_steps_repay_it(steps_left, now_s, after_s, cost_s, grow):
    assert worth_growing(steps_left, now_s, after_s, cost_s) is grow
