"""Sending tasks by name: many per-job tasks go as fan-out messages that a worker expands."""

from __future__ import annotations

import time
from typing import Any

import pytest

from controlplane.celery import app
from jobs import dispatch, tasks


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, tuple[Any, ...]]]:
    messages: list[tuple[str, tuple[Any, ...]]] = []
    monkeypatch.setattr(app, "send_task", lambda name, args=(), **_: messages.append((name, tuple(args))))
    return messages


def test_a_few_tasks_go_one_message_each(sent: list[tuple[str, tuple[Any, ...]]]) -> None:
    dispatch.send_each(dispatch.PROVISION, [(job_id,) for job_id in range(dispatch.FAN_OUT_CHUNK)])
    assert sent == [(dispatch.PROVISION, (job_id,)) for job_id in range(dispatch.FAN_OUT_CHUNK)]


def test_many_tasks_go_in_chunks_that_a_worker_fans_out_to_one_task_each(
    sent: list[tuple[str, tuple[Any, ...]]],
) -> None:
    jobs = [(job_id,) for job_id in range(2 * dispatch.FAN_OUT_CHUNK + 50)]
    dispatch.send_each(dispatch.PROVISION, jobs)
    assert [name for name, _ in sent] == [dispatch.FAN_OUT] * 3
    chunks = [args for _, args in sent]
    assert [len(chunk) for _, chunk in chunks] == [dispatch.FAN_OUT_CHUNK, dispatch.FAN_OUT_CHUNK, 50]
    sent.clear()
    # The worker's task, as the broker delivers it (JSON: tuples arrive as lists).
    assert sum(tasks.fan_out(name, [list(a) for a in chunk]) for name, chunk in chunks) == len(jobs)
    assert sent == [(dispatch.PROVISION, job) for job in jobs]


@pytest.mark.parametrize(
    ("name", "count", "error"),
    [
        ("jobs.tasks.admit_queued_jobs", 1, "only jobs.tasks.provision_job, jobs.tasks.teardown_job fan out"),
        (dispatch.FAN_OUT, 1, "only jobs.tasks.provision_job"),
        (dispatch.TEARDOWN, dispatch.FAN_OUT_CHUNK + 1, f"at most {dispatch.FAN_OUT_CHUNK} do"),
    ],
)
def test_a_fan_out_message_sends_only_per_job_tasks_and_no_more_than_a_chunk(
    sent: list[tuple[str, tuple[Any, ...]]], name: str, count: int, error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        tasks.fan_out(name, [[job_id] for job_id in range(count)])
    assert sent == []


def test_only_per_job_tasks_are_sent_in_chunks(sent: list[tuple[str, tuple[Any, ...]]]) -> None:
    with pytest.raises(ValueError, match="cannot be fanned out"):
        dispatch.send_each(dispatch.ADMIT, [()] * (dispatch.FAN_OUT_CHUNK + 1))
    assert sent == []


def test_a_request_for_admission_carries_when_it_was_sent_and_other_tasks_their_own_args(
    sent: list[tuple[str, tuple[Any, ...]]],
) -> None:
    before = time.time()
    dispatch.send(dispatch.ADMIT)
    after = time.time()
    dispatch.send(dispatch.PROVISION, 7)
    dispatch.send(dispatch.ADMIT, 12.5)  # a stamp given is kept
    (admit, stamp), provision, kept = sent
    assert admit == dispatch.ADMIT and before <= stamp[0] <= after and len(stamp) == 1
    assert provision == (dispatch.PROVISION, (7,))
    assert kept == (dispatch.ADMIT, (12.5,))
