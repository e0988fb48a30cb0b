"""Label values are bounded: reasons, causes and classes fall into fixed sets, others into _other."""

from __future__ import annotations

import pytest

from controlplane.monitoring import OTHER, LabelBound, priority_band
from jobs.monitoring import (
    INTERRUPTION_CAUSES,
    PENDING_REASONS,
    health_changer,
    interruption_cause,
    label_class,
    pending_reason_class,
)


def test_a_value_outside_its_set_is_other_and_counted():
    bound = LabelBound()
    bound.allow("tenant", ["acme", "globex"])
    assert bound("tenant", "acme") == "acme"
    assert bound("tenant", "mallory") == OTHER
    assert bound("task", "anything") == OTHER  # a label with no set allows nothing
    assert dict(bound.overflow) == {"tenant": 1, "task": 1}


@pytest.mark.parametrize(
    ("priority", "band"), [(-1000, "low"), (-1, "low"), (0, "normal"), (1, "high"), (1000, "high")]
)
def test_priorities_fall_into_three_bands(priority, band):
    assert priority_band(priority) == band


@pytest.mark.parametrize(
    ("reason", "kind"),
    [
        ("", "undecided"),
        ("waiting for 4 devices; free now: 2 h100-sxm", "capacity"),
        ("waiting for 4 devices; free now: 8 h100-sxm; needs 4 devices but your tenant may hold at most 2", "quota"),
        ("no quota for tpu-v4; ask an operator", "quota"),
        ("hard budget reached: USD 10 spent of 10 in 2026-12; raise the budget", "budget"),
        ("making room: preempting job 7", "making_room"),
        ("preempted; waiting to be admitted again", "preempted"),
        ("waiting for devices: needs at least 2 of a100-sxm; 1 free", "recovering"),
        ("something new", "other"),
    ],
)
def test_pending_reasons_fall_into_classes(reason, kind):
    assert pending_reason_class(reason) == kind
    assert kind in PENDING_REASONS


@pytest.mark.parametrize(
    ("reason", "cause"),
    [
        ("preempted by higher-priority job 9 (priority 10 > 0)", "preempted"),
        ("reclaimed by tenant 3 within its nominal quota", "reclaimed"),
        ("device n/0: failure predicted within 30 min", "drained"),
        ("node n-1 failed", "node"),
        ("heartbeat lost for 30 s", "heartbeat"),
        ("rank 1 exit code 137", "exit"),
        ("a mystery", "other"),
    ],
)
def test_interruptions_fall_into_causes(reason, cause):
    assert interruption_cause(reason) == cause
    assert cause in INTERRUPTION_CAUSES


def test_who_changed_a_devices_health_and_what_class_a_job_is():
    assert health_changer("recovery") == "recovery"
    assert health_changer("failure predicted within 30 min (3 of 3 to drain)") == "predictor"
    assert health_changer("cluster: node not ready") == "cluster"
    assert health_changer("alice") == "operator"
    assert label_class("charlm") == "charlm"
    assert label_class("python:0a1b2c3d4e5f:train.py") == "python"
    assert label_class("container:registry/img:1") == "container"
