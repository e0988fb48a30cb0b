"""A run's pods read as the backend's Observation (runtime.backends.kubernetes.observe): phases, and failures with a
cause the control plane understands (the user's program, the node under it, the cluster's own disruption)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from runtime.backends.base import Phase
from runtime.backends.kubernetes.observe import PULL_GRACE_S, observation_of
from runtime.worker.cli import EXIT_BAD_CONFIG

pytestmark = pytest.mark.unit

NOW = 1_800_000_000.0


def rank_pod(rank: int, phase: str = "Running", **container: Any) -> dict[str, Any]:
    """A rank's Pod as the apiserver answers it; ``container``: the rank container's state
    (``running``, ``waiting`` or ``terminated``), ``conditions``/``reason`` for the pod's status."""
    conditions = container.pop("conditions", [])
    status: dict[str, Any] = {"phase": phase, "conditions": conditions}
    if "reason" in container:
        status["reason"] = container.pop("reason")
    state = container or {"running": {"startedAt": "2027-01-15T08:00:00Z"}}
    status["containerStatuses"] = [{"name": "rank", "state": state}]
    labels = {"polychip.io/role": "rank", "polychip.io/rank": str(rank), "polychip.io/run": "job-7-a1"}
    return {"metadata": {"name": f"job-7-a1-r{rank}", "labels": labels}, "status": status}


def ended(code: int, reason: str = "Error", at: str = "2027-01-15T08:10:00Z") -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, "finishedAt": at}}


def store_pod(phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"labels": {"polychip.io/role": "store"}}, "status": {"phase": phase}}


def disrupted(reason: str) -> list[dict[str, str]]:
    return [{"type": "DisruptionTarget", "status": "True", "reason": reason}]


def observe(*pods: dict[str, Any], world_size: int = 2) -> Any:
    return observation_of([store_pod(), *pods], world_size, now=NOW)


def test_ranks_running_then_succeeded_or_stopped():
    assert observe(rank_pod(0), rank_pod(1)).phase == Phase.RUNNING
    both = observe(rank_pod(0, "Succeeded", **ended(0, "Completed")), rank_pod(1, "Succeeded", **ended(0)))
    assert (both.phase, [r.exit_code for r in both.ranks]) == (Phase.SUCCEEDED, [0, 0])
    stopped = observe(rank_pod(0, "Failed", **ended(4)), rank_pod(1, "Failed", **ended(4)))
    assert (stopped.phase, stopped.failure) == (Phase.STOPPED, None)


def test_pods_not_yet_running_are_pending_with_which():
    scheduled = {"waiting": {"reason": "ContainerCreating"}}
    seen = observe(rank_pod(0, "Pending", **scheduled), rank_pod(1))
    assert (seen.phase, seen.reason) == (Phase.PENDING, "rank 0 pending")


@pytest.mark.parametrize(
    ("failed_pod", "cause", "suspect", "reason"),
    [
        (rank_pod(1, "Failed", **ended(1)), "exit", False, "rank 1 exited with 1 (Error)"),
        (rank_pod(1, "Failed", **ended(137, "OOMKilled")), "exit", False, "rank 1 exited with 137 (OOMKilled)"),
        (
            rank_pod(1, "Failed", **ended(143), conditions=disrupted("DeletionByTaintManager")),
            "node",
            True,
            "rank 1: its node failed (DeletionByTaintManager)",
        ),
        (
            rank_pod(1, "Failed", **ended(143), conditions=disrupted("EvictionByEvictionAPI")),
            "disruption",
            False,
            "rank 1: the cluster took its pod away (EvictionByEvictionAPI)",
        ),
        (
            rank_pod(1, "Failed", reason="Evicted", waiting={"reason": "ContainerCreating"}),
            "disruption",
            False,
            "rank 1: the cluster took its pod away (Evicted)",
        ),
        (
            rank_pod(1, "Failed", reason="NodeLost", running={}),
            "node",
            True,
            "rank 1: its node failed (NodeLost)",
        ),
    ],
)
def test_a_failed_rank_is_named_with_its_cause_while_the_others_still_run(failed_pod, cause, suspect, reason):
    seen = observe(rank_pod(0), failed_pod)
    assert seen.phase == Phase.RUNNING  # rank 0 still runs: the control plane stops it and recovers
    assert (seen.failure.rank, seen.failure.cause, seen.failure.device_suspect) == (1, cause, suspect)
    assert seen.reason == reason


def test_the_first_failure_by_time_is_the_cause_and_a_peer_lost_victim_is_not_one():
    early = rank_pod(1, "Failed", **ended(1, at="2027-01-15T08:05:00Z"))
    later = rank_pod(2, "Failed", **ended(1, at="2027-01-15T08:09:00Z"))
    victim = rank_pod(0, "Failed", **ended(3, at="2027-01-15T08:05:01Z"))
    seen = observe(victim, later, early, world_size=3)
    assert seen.phase == Phase.FAILED  # every rank has ended
    assert seen.failure.rank == 1
    assert seen.failure.detected_at == datetime(2027, 1, 15, 8, 5, tzinfo=UTC).timestamp()  # when it ended
    assert [f.rank for f in seen.failures] == [1, 2]


def test_a_rank_whose_pod_vanished_is_gone():
    seen = observe(rank_pod(0))
    assert (seen.failure.rank, seen.failure.cause, seen.reason) == (1, "gone", "rank 1's pod is gone")


def test_an_image_that_still_cannot_be_pulled_fails_the_run_as_the_programs_fault_not_to_be_retried():
    waiting = {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "ghcr.io/acme/nope:1"'}}
    fresh = rank_pod(1, "Pending", **waiting)
    fresh["metadata"]["creationTimestamp"] = datetime.fromtimestamp(NOW - 60, UTC).isoformat()
    early = observe(rank_pod(0), fresh)
    assert (early.phase, early.reason, early.failure) == (Phase.PENDING, "rank 1 ImagePullBackOff", None)
    fresh["metadata"]["creationTimestamp"] = datetime.fromtimestamp(NOW - PULL_GRACE_S, UTC).isoformat()
    seen = observe(rank_pod(0), fresh)
    assert seen.phase == Phase.FAILED
    assert seen.reason == 'rank 1: ImagePullBackOff: Back-off pulling image "ghcr.io/acme/nope:1"'
    assert (seen.failure.rank, seen.failure.cause, seen.failure.exit_code) == (1, "exit", EXIT_BAD_CONFIG)


def test_an_image_name_that_cannot_be_one_fails_at_once():
    seen = observe(rank_pod(0), rank_pod(1, "Pending", waiting={"reason": "InvalidImageName"}))
    assert (seen.phase, seen.failure.exit_code) == (Phase.FAILED, EXIT_BAD_CONFIG)


def test_a_container_jobs_exit_codes_are_its_own():
    ended_4 = [rank_pod(0, "Failed", **ended(4)), rank_pod(1, "Failed", **ended(4))]
    assert observation_of([store_pod(), *ended_4], 2, now=NOW).phase == Phase.STOPPED  # the worker's meaning
    theirs = observation_of([store_pod(), *ended_4], 2, now=NOW, polychip_exit_codes=False)
    assert (theirs.phase, theirs.failure.cause, theirs.failure.exit_code) == (Phase.FAILED, "exit", 4)


def test_a_store_that_ended_fails_the_run_and_a_missing_parent_is_gone():
    seen = observation_of([store_pod("Failed"), rank_pod(0), rank_pod(1)], 2, now=NOW)
    assert (seen.phase, seen.reason) == (Phase.FAILED, "the rendezvous store's pod ended")
    assert observation_of([], 2, now=NOW, parent_exists=False).phase == Phase.GONE
