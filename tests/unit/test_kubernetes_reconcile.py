"""The reconciler's cache (``runtime.backends.kubernetes.reconcile.PodWatch``) against a scripted API:
events in, the cluster's state out, whatever the order of lists, watches, bookmarks and 410s."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from runtime.backends.kubernetes.api import ApiError, Listing
from runtime.backends.kubernetes.reconcile import MANAGED_PODS, PodWatch


def pod(name: str, run: str, version: int, phase: str = "Running") -> dict[str, Any]:
    labels = {"polychip.io/run": run, "app.kubernetes.io/managed-by": "polychip"}
    return {"metadata": {"name": name, "labels": labels, "resourceVersion": str(version)}, "status": {"phase": phase}}


class ScriptedApi:
    """``list`` answers the next listing; ``watch`` the next batch of events (a batch may be an exception)."""

    def __init__(self, listings: list[Listing], watches: list[list[dict[str, Any]] | Exception]) -> None:
        self.listings = listings
        self.watches = watches
        self.asked: list[tuple[str, str]] = []

    def list(self, kind: str, namespace: str | None, *, labels: str = "") -> Listing:
        assert (kind, namespace, labels) == ("Pod", "t", MANAGED_PODS)
        self.asked.append(("list", ""))
        return self.listings.pop(0)

    def watch(
        self, kind: str, namespace: str | None, *, labels: str, resource_version: str, timeout_s: int
    ) -> Iterator[dict[str, Any]]:
        self.asked.append(("watch", resource_version))
        batch = self.watches.pop(0)
        if isinstance(batch, Exception):
            raise batch
        yield from batch


def test_the_cache_is_not_trusted_before_its_first_list():
    watch = PodWatch(ScriptedApi([], []), "t")  # type: ignore[arg-type]
    assert watch.pods_of("run-1") is None


@pytest.mark.parametrize(
    ("events", "expected", "version"),
    [
        ([], {"run-1-r0": "Running"}, "10"),
        (
            [{"type": "ADDED", "object": pod("run-1-r1", "run-1", 11)}],
            {"run-1-r0": "Running", "run-1-r1": "Running"},
            "11",
        ),
        ([{"type": "MODIFIED", "object": pod("run-1-r0", "run-1", 12, "Succeeded")}], {"run-1-r0": "Succeeded"}, "12"),
        ([{"type": "DELETED", "object": pod("run-1-r0", "run-1", 13)}], {}, "13"),
        # A bookmark moves the version on and changes nothing else.
        ([{"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "40"}}}], {"run-1-r0": "Running"}, "40"),
        # The same event twice (a replay after a reconnect) is the same state.
        ([{"type": "MODIFIED", "object": pod("run-1-r0", "run-1", 12, "Failed")}] * 2, {"run-1-r0": "Failed"}, "12"),
    ],
)
def test_events_make_the_cache_the_clusters_state(events, expected, version):
    api = ScriptedApi([Listing([pod("run-1-r0", "run-1", 10)], "10")], [events])
    watch = PodWatch(api, "t")  # type: ignore[arg-type]
    watch.relist()
    assert watch.pump() == "timeout"

    assert {p["metadata"]["name"]: p["status"]["phase"] for p in watch.pods_of("run-1") or []} == expected
    assert watch.resource_version == version
    assert api.asked == [("list", ""), ("watch", "10")]


def test_a_410_lists_again_and_the_next_watch_resumes_from_the_new_list():
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired"}}
    after = [pod("run-1-r0", "run-1", 50, "Succeeded"), pod("run-2-r0", "run-2", 51)]
    api = ScriptedApi(
        [Listing([pod("run-1-r0", "run-1", 10)], "10"), Listing(after, "51")],
        [[gone, {"type": "ADDED", "object": pod("never", "run-9", 11)}], []],
    )
    watch = PodWatch(api, "t")  # type: ignore[arg-type]
    watch.relist()

    assert watch.pump() == "gone"  # nothing after the 410 is applied: the list stands for it
    assert watch.relists == 1 and watch.pods_of("run-9") == []
    assert [p["status"]["phase"] for p in watch.pods_of("run-1") or []] == ["Succeeded"]
    watch.pump()
    assert api.asked == [("list", ""), ("watch", "10"), ("list", ""), ("watch", "51")]


def test_a_broken_watch_makes_the_cache_untrusted_until_the_next_list():
    api = ScriptedApi(
        [Listing([pod("run-1-r0", "run-1", 10)], "10"), Listing([], "20")],
        [ApiError(0, "the apiserver could not be reached")],
    )
    naps: list[float] = []
    watch = PodWatch(api, "t", sleep=lambda s: (naps.append(s), watch.stop()))  # type: ignore[arg-type]
    watch.relist()
    watch.run()  # the watch breaks; the loop backs off (and this test stops it there)

    assert naps == [1.0]
    assert watch.pods_of("run-1") is None  # stale: nobody keeps it current
    watch.relist()  # a list that ends after the stop changes nothing
    assert watch.pods_of("run-1") is None and watch.relists == 0
