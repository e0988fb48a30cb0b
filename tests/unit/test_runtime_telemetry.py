"""Worker telemetry: batching, the bearer token, the JSON-lines file, bounded retries."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from runtime.worker.telemetry import MAX_ATTEMPTS, Telemetry

COMMON = {"job": "j", "rank": 0, "device_id": "d/0", "flavor": "h100-sxm"}


class FakeIngest:
    def __init__(self, statuses: list[int | Exception] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.calls: list[tuple[str, dict[str, Any], dict[str, str]]] = []

    def __call__(self, url: str, payload: dict[str, Any], headers: dict[str, str], timeout_s: float) -> int:
        self.calls.append((url, payload, headers))
        outcome = self.statuses.pop(0) if self.statuses else 200
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def delivered(self) -> list[dict[str, Any]]:
        return [e for _, payload, _ in self.calls for e in payload["events"]]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_events_are_batched_with_the_bearer_token_and_written_to_the_file(tmp_path: Path) -> None:
    ingest, path = FakeIngest(), tmp_path / "t.jsonl"
    telemetry = Telemetry(COMMON, url="http://cp/ingest", token="s3cret", file=str(path), post=ingest)
    telemetry.emit("started", world_size=2, steps=3)
    telemetry.emit("step", step=1, loss=2.3)
    telemetry.flush()
    assert len(ingest.calls) == 1
    url, payload, headers = ingest.calls[0]
    assert url == "http://cp/ingest" and headers == {"Authorization": "Bearer s3cret"}
    assert [e["kind"] for e in payload["events"]] == ["started", "step"]
    event = payload["events"][1]
    assert {k: event[k] for k in COMMON} == COMMON and event["step"] == 1 and isinstance(event["ts"], float)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == payload["events"]


def test_a_transient_outage_is_retried_with_backoff() -> None:
    ingest, clock = FakeIngest([ConnectionError("refused"), 503]), Clock()
    telemetry = Telemetry(COMMON, url="http://cp", post=ingest, monotonic=clock)
    telemetry.emit("step", step=1)
    telemetry.flush()  # refused
    telemetry.flush()  # backing off: no attempt yet
    assert len(ingest.calls) == 1
    clock.now += 0.6
    telemetry.emit("step", step=2)
    telemetry.flush()  # 503
    clock.now += 1.1
    telemetry.flush()  # delivered, both events in one batch
    assert len(ingest.calls) == 3
    assert [e["step"] for e in ingest.delivered()[-2:]] == [1, 2]
    assert telemetry.dropped == 0 and telemetry.sent == 2


def test_a_batch_is_dropped_after_bounded_attempts_and_sending_goes_on() -> None:
    ingest, clock = FakeIngest([500] * MAX_ATTEMPTS), Clock()
    telemetry = Telemetry(COMMON, url="http://cp", post=ingest, monotonic=clock)
    telemetry.emit("step", step=1)
    for _ in range(MAX_ATTEMPTS):
        clock.now += 100
        telemetry.flush()
    assert telemetry.dropped == 1
    telemetry.emit("step", step=2)
    clock.now += 100
    telemetry.flush()
    assert ingest.calls[-1][1]["events"][0]["step"] == 2 and telemetry.sent == 1


def test_a_rejected_token_is_not_retried() -> None:
    ingest = FakeIngest([403])
    telemetry = Telemetry(COMMON, url="http://cp", token="wrong", post=ingest)
    telemetry.emit("heartbeat", step=0)
    telemetry.flush()
    telemetry.flush()
    assert len(ingest.calls) == 1 and telemetry.dropped == 1


def test_the_thread_sends_heartbeats_and_close_flushes_the_rest(tmp_path: Path) -> None:
    ingest, path = FakeIngest(), tmp_path / "t.jsonl"
    telemetry = Telemetry(
        COMMON, url="http://cp", file=str(path), post=ingest, flush_interval_s=0.02, heartbeat_interval_s=0.02
    )
    telemetry.start()
    telemetry.set_progress(7)
    # Until the thread has sent a heartbeat of step 7 (every 20 ms when it gets the CPU), not a fixed
    # sleep: a thread starved of the CPU for the whole sleep is a busy machine, not a bug.
    deadline = time.monotonic() + 30
    while not any(e["kind"] == "heartbeat" and e["step"] == 7 for e in ingest.delivered()):
        assert time.monotonic() < deadline, "no heartbeat of step 7 in 30 s"
        time.sleep(0.005)
    telemetry.emit("finished", steps=7)
    telemetry.close()
    kinds = [e["kind"] for e in ingest.delivered()]
    assert "heartbeat" in kinds and kinds[-1] == "finished"
    assert any(e["kind"] == "heartbeat" and e["step"] == 7 for e in ingest.delivered())
    assert [json.loads(line)["kind"] for line in path.read_text().splitlines()] == kinds


class SteppedTime:
    """The telemetry module's ``time`` for a test: ``sleep`` moves ``monotonic`` on by exactly what was
    asked, and nothing else moves it, so a budget is checked on the code's own arithmetic, not on how
    promptly a busy machine wakes a sleeper."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def time(self) -> float:
        return time.time()


def test_close_gives_up_on_a_dead_ingest_within_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    import runtime.worker.telemetry as telemetry_module

    clock = SteppedTime()
    monkeypatch.setattr(telemetry_module, "time", clock)
    ingest = FakeIngest([ConnectionError("down")] * 100)
    telemetry = Telemetry(COMMON, url="http://cp", post=ingest)
    telemetry.emit("finished", steps=1)
    started = clock.monotonic()
    telemetry.close(budget_s=0.3)
    assert clock.monotonic() - started < 0.6
    assert telemetry.dropped == 1


def test_without_url_or_file_events_go_nowhere_quietly() -> None:
    telemetry = Telemetry(COMMON)
    telemetry.emit("step", step=1)
    telemetry.flush()
    telemetry.close()


def test_the_real_client_posts_json_to_an_http_server() -> None:
    received: list[tuple[str, dict[str, Any]]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.headers["Authorization"], json.loads(body)))
            self.send_response(200 if len(received) > 1 else 500)  # the first attempt fails
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        telemetry = Telemetry(COMMON, url=f"http://127.0.0.1:{server.server_port}/ingest", token="tok")
        telemetry.emit("step", step=1, loss=2.0)
        telemetry.flush()
        telemetry.close()
    finally:
        server.shutdown()
        server.server_close()
    assert [auth for auth, _ in received] == ["Bearer tok", "Bearer tok"]
    assert received[-1][1]["events"][0]["loss"] == 2.0 and telemetry.sent == 1
