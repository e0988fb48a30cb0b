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


def test_tallies_add_up_rows_whose_labels_fell_into_the_same_bucket():
    from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

    from controlplane.monitoring import HistogramTally, Tally

    summed, largest = Tally(), Tally(combine=max)
    for labels, value in ((["acme"], 1), ([OTHER], 2), ([OTHER], 3)):
        summed.add(labels, value)
        largest.add(labels, value)
    family = summed.into(GaugeMetricFamily("held", "", labels=["tenant"]))
    assert [(s.labels["tenant"], s.value) for s in family.samples] == [("_other", 5.0), ("acme", 1.0)]
    assert [s.value for s in largest.into(GaugeMetricFamily("age", "", labels=["tenant"])).samples] == [3.0, 1.0]

    waits = HistogramTally([1, 5])
    waits.add([OTHER], [1, 2, 2], 3.0)
    waits.add([OTHER], [0, 1, 3], 9.0)
    samples = waits.into(HistogramMetricFamily("wait", "", labels=["tenant"])).samples
    assert [(s.name, s.labels.get("le"), s.value) for s in samples] == [
        ("wait_bucket", "1.0", 1),
        ("wait_bucket", "5.0", 3),
        ("wait_bucket", "+Inf", 5),
        ("wait_count", None, 5),
        ("wait_sum", None, 12.0),
    ]


def test_task_counts_a_flush_could_not_save_are_kept_and_merged_with_later_ones(monkeypatch):
    from django.db import InterfaceError

    from controlplane import taskstats

    recorder = taskstats._Recorder()
    recorder.enabled = True
    recorder.started["a"] = 0.0
    recorder.end("a", "jobs.tasks.x", "SUCCESS", "celery@h")

    def down(*args: object) -> None:
        raise InterfaceError("connection already closed")

    monkeypatch.setattr(taskstats, "_fold", down)
    recorder.flush()
    assert recorder.tallies["jobs.tasks.x"].outcomes["succeeded"] == 1
    recorder.started["b"] = 0.0
    recorder.end("b", "jobs.tasks.x", "FAILURE", "celery@h")
    saved: list[dict] = []
    monkeypatch.setattr(taskstats, "_fold", lambda tallies, host, now: saved.append(tallies))
    recorder.flush()
    (tallies,) = saved
    assert tallies["jobs.tasks.x"].outcomes == {"succeeded": 1, "failed": 1, "retried": 0}
    assert sum(tallies["jobs.tasks.x"].runtime_counts) == 2 and not recorder.tallies
