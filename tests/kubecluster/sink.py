"""A stand-in for the control plane's telemetry ingest: what the ranks in the emulated cluster POST
(``{"events": [...]}`` with their bearer token), kept for the test to read."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class TelemetrySink:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.tokens: set[str] = set()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                sink.tokens.add(self.headers.get("Authorization", ""))
                sink.events.extend(json.loads(body or b"{}").get("events", []))
                self.send_response(202)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> TelemetrySink:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def steps(self, job_id: str, rank: int) -> list[int]:
        return [
            e["step"]
            for e in list(self.events)
            if e.get("kind") == "step" and e.get("job_id", job_id) == job_id and e.get("rank") == rank
        ]
