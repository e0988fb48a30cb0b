"""Telemetry from a worker: events batched by a background thread, never blocking training.

``emit`` only appends to an in-memory queue. A daemon thread adds a heartbeat every second and,
every half second, appends the queued events to the JSON-lines file (if any) and POSTs them as
``{"events": [...]}`` to the ingest URL (if any) with ``Authorization: Bearer <token>``.

HTTP failures are tolerated: a batch is retried with backoff a bounded number of times and then
dropped (counted, warned once on stderr); client errors other than 408/429 are not retried. The
queue of unsent events is bounded too, so a long outage costs the oldest events, not memory.
``close`` stops the thread and makes one last, time-bounded flush. With ``heartbeat_file`` each
heartbeat also touches that file, for a supervisor on the same host (``runtime.backends.local``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import requests

# (url, payload, headers, timeout_s) -> HTTP status code; raises on transport errors.
PostFn = Callable[[str, dict[str, Any], dict[str, str], float], int]

FLUSH_INTERVAL_S = 0.5
HEARTBEAT_INTERVAL_S = 1.0
MAX_BATCH = 500
MAX_UNSENT = 20_000
MAX_ATTEMPTS = 5
POST_TIMEOUT_S = 3.0
CLOSE_BUDGET_S = 5.0
CLOSE_ATTEMPTS = 3


def _requests_post() -> PostFn:
    session = requests.Session()

    def post(url: str, payload: dict[str, Any], headers: dict[str, str], timeout_s: float) -> int:
        return session.post(url, json=payload, headers=headers, timeout=timeout_s).status_code

    return post


def _retriable(status: int) -> bool:
    return status >= 500 or status in (408, 429)


class Telemetry:
    def __init__(
        self,
        common: dict[str, Any],
        *,
        url: str | None = None,
        token: str = "",
        file: str | None = None,
        heartbeat_file: str | None = None,
        device_probe: Callable[[], list[list[float]]] | None = None,
        flush_interval_s: float = FLUSH_INTERVAL_S,
        heartbeat_interval_s: float = HEARTBEAT_INTERVAL_S,
        post: PostFn | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._common = dict(common)
        self._url = url
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._file = file
        self._heartbeat_file = heartbeat_file
        self._pulse: threading.Thread | None = None
        self._pulse_stop = threading.Event()
        self._device_probe = device_probe
        self._flush_interval_s = flush_interval_s
        self._heartbeat_interval_s = heartbeat_interval_s
        self._post = post
        self._clock = clock
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._queue: deque[dict[str, Any]] = deque()
        self._unsent: deque[dict[str, Any]] = deque()
        self._attempts = 0
        self._next_attempt_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress = 0
        self.dropped = 0
        self.sent = 0
        self._warned: set[str] = set()

    # -- called from the training thread -------------------------------------------------------

    def emit(self, kind: str, **fields: Any) -> None:
        event = {**self._common, "kind": kind, "ts": self._clock(), **fields}
        with self._lock:
            self._queue.append(event)

    def set_progress(self, step: int) -> None:
        """The last completed step, reported with each heartbeat."""
        self._progress = step

    def start(self) -> None:
        if self._heartbeat_file and self._pulse is None:
            self._touch_heartbeat_file()
            self._pulse = threading.Thread(target=self._pulse_loop, name="polychip-heartbeat-file", daemon=True)
            self._pulse.start()
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="polychip-telemetry", daemon=True)
            self._thread.start()

    def close(self, budget_s: float = CLOSE_BUDGET_S) -> None:
        """Stop the thread and flush what is left, giving up after ``budget_s`` seconds. The heartbeat
        file keeps its pulse until the very end: a rank that flushes slowly is not a dead one."""
        try:
            self._close(budget_s)
        finally:
            self._pulse_stop.set()

    def _close(self, budget_s: float) -> None:
        deadline = time.monotonic() + budget_s
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=budget_s)
            if self._thread.is_alive():
                # Stuck in a POST: leave the queues to it rather than race it; the file still gets the tail.
                self._write_file(self._take_queue())
                return
            self._thread = None
        events = self._take_queue()
        self._write_file(events)
        url = self._url
        if url:
            self._unsent.extend(events)
        failures = 0
        while self._unsent and url and failures < CLOSE_ATTEMPTS:
            left = deadline - time.monotonic()
            if left <= 0.05:
                break
            self._attempts = 0  # at exit, the close budget and CLOSE_ATTEMPTS bound the retries
            if not self._send_batch(url, timeout_s=min(POST_TIMEOUT_S, left)):
                failures += 1
                if failures < CLOSE_ATTEMPTS:
                    time.sleep(min(0.2 * failures, max(0.0, deadline - time.monotonic())))
        if self._unsent and url:
            self.dropped += len(self._unsent)
            self._warn("close", f"telemetry: {len(self._unsent)} events not delivered at exit")
            self._unsent.clear()

    # -- the background thread ----------------------------------------------------------------

    def _loop(self) -> None:
        now = time.monotonic()
        next_heartbeat = now + self._heartbeat_interval_s
        next_flush = now + self._flush_interval_s
        while not self._stop.wait(timeout=max(0.0, min(next_heartbeat, next_flush) - time.monotonic())):
            now = time.monotonic()
            if now >= next_heartbeat:
                self.emit("heartbeat", step=self._progress, **self._device_readings())
                next_heartbeat = now + self._heartbeat_interval_s
            if now >= next_flush:
                try:
                    self.flush()
                except Exception as exc:  # a telemetry bug must never take training down
                    self._warn("loop", f"telemetry: flush failed: {exc!r}")
                next_flush = time.monotonic() + self._flush_interval_s

    def flush(self) -> None:
        """Write queued events to the file and make one HTTP attempt (if one is due)."""
        events = self._take_queue()
        self._write_file(events)
        url = self._url
        if not url:
            return
        self._unsent.extend(events)
        overflow = len(self._unsent) - MAX_UNSENT
        if overflow > 0:
            for _ in range(overflow):
                self._unsent.popleft()
            self.dropped += overflow
            self._warn("overflow", f"telemetry: ingest unreachable, dropping oldest events ({overflow})")
        if self._unsent and self._monotonic() >= self._next_attempt_at:
            self._send_batch(url, timeout_s=POST_TIMEOUT_S)

    def _pulse_loop(self) -> None:
        # Its own thread, doing nothing but this: the flush thread can block in a POST for seconds
        # (a slow control plane), and a watcher must not take that for a dead rank.
        while not self._pulse_stop.wait(timeout=self._heartbeat_interval_s):
            self._touch_heartbeat_file()

    def _device_readings(self) -> dict[str, Any]:
        # The device's health readings since the last heartbeat (temperature, power, ECC and PCIe
        # errors, step jitter; one row a minute), for the control plane's failure predictor.
        if self._device_probe is None:
            return {}
        try:
            readings = self._device_probe()
        except Exception as exc:  # a broken probe must never take training down
            self._warn("device_probe", f"telemetry: the device probe failed: {exc!r}")
            return {}
        return {"device_readings": readings} if readings else {}

    def _touch_heartbeat_file(self) -> None:
        # Its modification time is the heartbeat a supervisor on this host watches: a process that
        # is stopped or wedged stops touching it, while its sockets may look alive for minutes.
        if not self._heartbeat_file:
            return
        try:
            with open(self._heartbeat_file, "a"):
                pass
            os.utime(self._heartbeat_file)
        except OSError as exc:
            self._warn("heartbeat_file", f"telemetry: cannot touch {self._heartbeat_file}: {exc}")

    def _take_queue(self) -> list[dict[str, Any]]:
        with self._lock:
            events = list(self._queue)
            self._queue.clear()
        return events

    def _write_file(self, events: list[dict[str, Any]]) -> None:
        if not self._file or not events:
            return
        data = "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events).encode()
        try:
            # One O_APPEND write per batch keeps lines whole even if several ranks share the file.
            fd = os.open(self._file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            self._warn("file", f"telemetry: cannot append to {self._file}: {exc}")

    def _send_batch(self, url: str, timeout_s: float) -> bool:
        """Try to deliver the head of the unsent queue to ``url`` once; True when it was delivered."""
        if self._post is None:
            self._post = _requests_post()
        batch = [self._unsent[i] for i in range(min(MAX_BATCH, len(self._unsent)))]
        try:
            status = self._post(url, {"events": batch}, self._headers, timeout_s)
            error = "" if 200 <= status < 300 else f"HTTP {status}"
            retriable = _retriable(status)
        except Exception as exc:  # transport errors: refused, timed out, DNS
            error, retriable = repr(exc), True
        if not error:
            for _ in batch:
                self._unsent.popleft()
            self.sent += len(batch)
            self._attempts = 0
            self._next_attempt_at = 0.0
            return True
        self._attempts += 1
        if not retriable or self._attempts >= MAX_ATTEMPTS:
            for _ in batch:
                self._unsent.popleft()
            self.dropped += len(batch)
            self._attempts = 0
            self._next_attempt_at = 0.0
            self._warn(f"drop:{error[:40]}", f"telemetry: dropped {len(batch)} events after {error}")
        else:
            # Exponential backoff: 0.5 s, 1 s, 2 s, ... between attempts on the same batch.
            self._next_attempt_at = self._monotonic() + self._flush_interval_s * 2 ** (self._attempts - 1)
        return False

    def _warn(self, key: str, message: str) -> None:
        # Once per kind of problem: stderr is what the supervisor shows when a rank fails.
        if key not in self._warned:
            self._warned.add(key)
            print(message, file=sys.stderr, flush=True)  # noqa: T201 (stderr is this process's log, which the supervisor shows)
