"""What a run's pods say of it: the backend's ``Observation`` from the Pod objects of one run.

The apiserver's answer is the evidence (plain JSON, as ``kubectl get pods -o json`` prints); this module
decides what it means, so that the reconciler only lists, watches and hands the pods here.

- Every rank ended with 0: succeeded. Every rank stopped on request (exit 4, after a full checkpoint): stopped.
- A rank that ended on its own with an error is the user's: cause ``exit`` (an out-of-memory kill too,
  with its reason), counted like any failure of the program.
- A rank whose pod the cluster took away is not: the node under it failed (the taint manager or the
  pod garbage collector deleted it, or the node was lost): cause ``node``, evidence against the device;
  the cluster made room or drained (preemption, eviction through the API, the kubelet's pressure
  eviction or graceful shutdown): cause ``disruption``, evidence against nobody.
- A pod that lost its rank is ``gone``; a rank that died because a peer did (exit 3) is a victim, not a cause.
- An image name that cannot be one fails the run at once, and an image that still cannot be pulled (or a
  container that still cannot be created) ``PULL_GRACE_S`` after its pod was made fails it then, with
  the reason and as the program's fault, not to be restarted: no restart would fix it. Before that the
  run is pending with the reason, since a registry's refusal or a late Secret can pass.
- A ``container`` job's exit codes are the tenant program's own: only the Polychip worker's meanings
  (3: a peer was lost, 4: stopped on request) are read for the others (``polychip_exit_codes``).

Nothing here talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from runtime.backends.base import DISRUPTION, NODE_LOST, Failure, Observation, Phase, RankState
from runtime.backends.kubernetes.manifests import LABEL_RANK, LABEL_ROLE
from runtime.worker.cli import EXIT_BAD_CONFIG, EXIT_PEER_LOST, EXIT_STOPPED

# DisruptionTarget reasons (Kubernetes 1.26+) by what they say of the node.
_NODE_FAILED = frozenset({"DeletionByTaintManager", "DeletionByPodGC"})
_DISRUPTED = frozenset({"PreemptionByScheduler", "EvictionByEvictionAPI", "TerminationByKubelet"})
# Waiting reasons that no wait will cure, and those that a wait may (a registry's 429, a Secret made late).
_HOPELESS_WAITS = frozenset({"InvalidImageName"})
_DOUBTFUL_WAITS = frozenset({"ErrImagePull", "ImagePullBackOff", "CreateContainerConfigError", "CreateContainerError"})
PULL_GRACE_S = 300.0


def _time(text: Any, default: float) -> float:
    if not isinstance(text, str):
        return default
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return default


def _container(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or []
    return next((s for s in statuses if s.get("name") == "rank"), statuses[0] if statuses else {})


def _disruption(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(cause, reason) when the cluster, not the rank, ended the pod."""
    for condition in pod.get("status", {}).get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            reason = str(condition.get("reason", ""))
            if reason in _NODE_FAILED:
                return NODE_LOST, reason
            return DISRUPTION, reason or "disrupted"
    status_reason = pod.get("status", {}).get("reason")
    if status_reason in ("NodeLost", "UnexpectedAdmissionError"):
        return NODE_LOST, str(status_reason)
    if status_reason in ("Evicted", "Preempting", "Terminated", "Shutdown", "NodeShutdown"):
        return DISRUPTION, str(status_reason)
    return None


def observation_of(
    pods: Iterable[Mapping[str, Any]],
    world_size: int,
    *,
    now: float,
    parent_exists: bool = True,
    polychip_exit_codes: bool = True,
) -> Observation:
    """The run as its pods show it; ``parent_exists`` false: the run is gone from the cluster;
    ``polychip_exit_codes`` false for a container job, whose exit codes mean what its program says."""
    stopped, peer_lost = (EXIT_STOPPED, EXIT_PEER_LOST) if polychip_exit_codes else (None, None)
    if not parent_exists:
        return Observation(phase=Phase.GONE, reason="the run's objects are gone from the cluster")
    by_rank: dict[int, Mapping[str, Any]] = {}
    store: Mapping[str, Any] | None = None
    for item in pods:
        labels = item.get("metadata", {}).get("labels") or {}
        if labels.get(LABEL_ROLE) == "store":
            store = item
        elif (rank := rank_of(item)) is not None:
            by_rank[rank] = item

    ranks: list[RankState] = []
    failures: list[Failure] = []
    ended: dict[int, int] = {}
    pending: list[str] = []
    for rank in range(world_size):
        pod = by_rank.get(rank)
        if pod is None:
            # A pod that was created and is no longer there went with its node or someone's delete.
            failures.append(Failure(rank=rank, cause="gone", detected_at=now))
            ranks.append(RankState(rank=rank, pid=None, exit_code=None))
            continue
        container = _container(pod)
        state = container.get("state") or {}
        waiting = state.get("waiting") or {}
        made_at = _time(pod.get("metadata", {}).get("creationTimestamp"), now)
        if waiting.get("reason") in _HOPELESS_WAITS or (
            waiting.get("reason") in _DOUBTFUL_WAITS and now - made_at >= PULL_GRACE_S
        ):
            why = f"rank {rank}: {waiting['reason']}: {str(waiting.get('message', ''))[:300]}".rstrip(": ")
            ranks.append(RankState(rank=rank, pid=None, exit_code=None))
            # The program's fault and not to be retried: what a worker's unusable config also means.
            hopeless = Failure(rank=rank, cause="exit", detected_at=now, exit_code=EXIT_BAD_CONFIG)
            return Observation(
                phase=Phase.FAILED, ranks=tuple(ranks), reason=why, failure=hopeless, failures=(hopeless,)
            )
        if waiting.get("reason") in _DOUBTFUL_WAITS:
            ranks.append(RankState(rank=rank, pid=None, exit_code=None))
            pending.append(f"rank {rank} {waiting['reason']}")
            continue
        fetch = _failed_init(pod)
        if fetch is not None:  # its code could not be fetched (1) or was refused (2: bad config, not retried)
            ranks.append(RankState(rank=rank, pid=None, exit_code=None))
            at = _time(fetch.get("finishedAt"), now)
            ended[rank] = int(fetch["exitCode"])
            failures.append(Failure(rank=rank, cause="exit", detected_at=at, exit_code=fetch.get("exitCode")))
            continue
        terminated = state.get("terminated")
        disrupted = _disruption(pod)
        phase = pod.get("status", {}).get("phase")
        if terminated is None and disrupted is None and phase not in ("Failed", "Succeeded"):
            ranks.append(RankState(rank=rank, pid=None, exit_code=None))
            if phase != "Running":
                pending.append(f"rank {rank} {str(phase or 'Pending').lower()}")
            continue
        code = terminated.get("exitCode") if isinstance(terminated, dict) else None
        code = code if isinstance(code, int) else None
        ranks.append(RankState(rank=rank, pid=None, exit_code=code))
        if code is not None:
            ended[rank] = code
        at = _time((terminated or {}).get("finishedAt"), now)
        if disrupted is not None:
            cause, _ = disrupted
            failures.append(Failure(rank=rank, cause=cause, detected_at=at, exit_code=code))
        elif code not in (None, 0, stopped, peer_lost):
            failures.append(Failure(rank=rank, cause="exit", detected_at=at, exit_code=code))
        elif code is None:  # Failed with no terminated state: the pod ended without its container running
            failures.append(Failure(rank=rank, cause="gone", detected_at=at))

    failures.sort(key=lambda f: (f.detected_at, f.rank))
    first = failures[0] if failures else None
    everyone_ended = len(ended) == world_size
    if first is not None:
        reason = _failure_reason(first, by_rank.get(first.rank))
        return Observation(
            phase=Phase.FAILED if everyone_ended else Phase.RUNNING,
            ranks=tuple(ranks),
            reason=reason,
            failure=first,
            failures=tuple(failures),
        )
    if everyone_ended and all(code == 0 for code in ended.values()):
        return Observation(phase=Phase.SUCCEEDED, ranks=tuple(ranks))
    if everyone_ended and all(code in (0, stopped) for code in ended.values()):
        return Observation(phase=Phase.STOPPED, ranks=tuple(ranks), reason="stopped on request after a checkpoint")
    if everyone_ended:  # only victims: a peer was lost and nobody saw it go
        return Observation(phase=Phase.FAILED, ranks=tuple(ranks), reason="every rank lost its peers")
    if store is not None and store.get("status", {}).get("phase") in ("Failed", "Succeeded"):
        return Observation(phase=Phase.FAILED, ranks=tuple(ranks), reason="the rendezvous store's pod ended")
    if pending:
        return Observation(phase=Phase.PENDING, ranks=tuple(ranks), reason=", ".join(pending))
    return Observation(phase=Phase.RUNNING, ranks=tuple(ranks))


def rank_of(pod: Mapping[str, Any]) -> int | None:
    """The rank a pod runs, from its labels; None for the store or anything else."""
    labels = pod.get("metadata", {}).get("labels") or {}
    value = str(labels.get(LABEL_RANK, ""))
    return int(value) if labels.get(LABEL_ROLE) == "rank" and value.isdigit() else None


def _failed_init(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The terminated state of an init container that failed, if one did."""
    for status in pod.get("status", {}).get("initContainerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if isinstance(terminated.get("exitCode"), int) and terminated["exitCode"] != 0:
            return terminated
    return None


def _failure_reason(failure: Failure, pod: Mapping[str, Any] | None) -> str:
    if pod is not None and (fetch := _failed_init(pod)) is not None:
        what = "was refused" if fetch.get("exitCode") == EXIT_BAD_CONFIG else "could not be fetched"
        return f"rank {failure.rank}: its code bundle {what} (init container exited with {fetch.get('exitCode')})"
    if failure.cause == "gone":
        return f"rank {failure.rank}'s pod is gone"
    if failure.cause in (NODE_LOST, DISRUPTION) and pod is not None:
        _, why = _disruption(pod) or ("", "")
        what = "its node failed" if failure.cause == NODE_LOST else "the cluster took its pod away"
        return f"rank {failure.rank}: {what} ({why})"
    terminated = ((_container(pod) if pod else {}).get("state") or {}).get("terminated") or {}
    detail = terminated.get("reason") or "Error"
    return f"rank {failure.rank} exited with {failure.exit_code} ({detail})"
