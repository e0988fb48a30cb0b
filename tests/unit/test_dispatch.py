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


@pytest.fixture
def coalescing(settings: Any) -> None:
    """Requests for admission coalesce, as where every process shares the cache (in-process here)."""
    settings.POLYCHIP_COALESCE_ADMISSION_REQUESTS = True


def test_a_request_for_admission_is_not_sent_while_another_waits_untaken(
    sent: list[tuple[str, tuple[Any, ...]]], coalescing: None
) -> None:
    for _ in range(3):
        dispatch.send(dispatch.ADMIT)
    assert [name for name, _ in sent] == [dispatch.ADMIT]  # the other two are covered by the first
    (sent_at,) = sent[0][1]
    before = time.time()
    # A worker takes it: the request now stands for when it was taken, after both held-back commits.
    taken_at = dispatch.take_admission_request(sent_at)
    assert taken_at is not None and taken_at >= before >= sent_at
    dispatch.send(dispatch.ADMIT)
    assert len(sent) == 2  # taken: the next change sends its own


def test_beats_request_leaves_the_pending_mark_alone(sent: list[tuple[str, tuple[Any, ...]]], coalescing: None) -> None:
    dispatch.send(dispatch.ADMIT)
    assert dispatch.take_admission_request(None) is None  # the sweep always runs a cycle
    dispatch.send(dispatch.ADMIT)
    assert len(sent) == 1  # the first request is still in the broker, and covers this one


def test_without_a_shared_cache_every_request_is_sent(sent: list[tuple[str, tuple[Any, ...]]], settings: Any) -> None:
    settings.POLYCHIP_COALESCE_ADMISSION_REQUESTS = False  # the embedded default: a cache per process
    for _ in range(3):
        dispatch.send(dispatch.ADMIT)
    assert [name for name, _ in sent] == [dispatch.ADMIT] * 3
    assert dispatch.take_admission_request(12.5) == 12.5  # stamped when sent


def test_a_lost_request_holds_back_others_only_until_its_mark_expires(
    sent: list[tuple[str, tuple[Any, ...]]], coalescing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatch, "PENDING_ADMIT_TTL_S", 0.05)
    dispatch.send(dispatch.ADMIT)  # suppose it never reaches a worker
    dispatch.send(dispatch.ADMIT)
    assert len(sent) == 1
    time.sleep(0.1)
    dispatch.send(dispatch.ADMIT)
    assert len(sent) == 2


def test_a_failing_cache_never_holds_a_request_back(
    sent: list[tuple[str, tuple[Any, ...]]], coalescing: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    def down(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("the cache is down")

    monkeypatch.setattr(dispatch.cache, "add", down)
    monkeypatch.setattr(dispatch.cache, "delete", down)
    dispatch.send(dispatch.ADMIT)
    dispatch.send(dispatch.ADMIT)
    assert len(sent) == 2
    assert dispatch.take_admission_request(1.0) is not None  # taken all the same, stamped now


def test_a_request_the_broker_refused_holds_nothing_back(coalescing: None, monkeypatch: pytest.MonkeyPatch) -> None:
    messages: list[str] = []

    def broker_down(name: str, args: Any = (), **_: Any) -> None:
        raise ConnectionError("the broker is down")

    monkeypatch.setattr(app, "send_task", broker_down)
    with pytest.raises(ConnectionError):
        dispatch.send(dispatch.ADMIT)
    monkeypatch.setattr(app, "send_task", lambda name, args=(), **_: messages.append(name))
    dispatch.send(dispatch.ADMIT)
    assert messages == [dispatch.ADMIT]  # not held back by the mark of the request that never left
