"""``GET /api/v1/jobs/{id}/logs``: what the job's ranks wrote to stdout and stderr.

Query parameters:

- ``rank``: one rank (from 0); absent, every rank's lines interleaved by time.
- ``attempt``: which run, counted from 0 as the job's ``attempt`` field counts them (0 is the first
  run, 1 the first restart...); absent, the newest.
- ``since``: an ISO 8601 time (lines read at or after it; no zone means UTC), or the cursor an earlier
  answer gave (``X-Log-Cursor``, or the ``cursor`` lines of a JSON lines stream): the lines right after
  the last one it had, per rank, with none twice and none skipped.
- ``tail``: the last N lines only (at most 10,000).
- ``limit``: at most this many lines in one answer (default and most 10,000); ``X-Log-More: true``
  says there are more already, to be read from ``X-Log-Cursor``.
- ``format``: ``text`` (default; one line per log line, ``[rank N] `` before each when several ranks
  are read) or ``jsonl`` (one ``{"t", "rank", "stream", "line"}`` object per line, ``t`` ISO 8601 UTC).
- ``follow``: ``true`` streams new lines as they are written, until the attempt's run has ended (a
  job not started yet is waited for); the stream ends then, or when the client goes.

Each rank keeps its newest output up to a size cap. When lines the answer would have begun with were
dropped, ``X-Log-Dropped`` says how many per rank (``0:1200,3:5``) and a line says so where they were:
``[polychip] 1200 earlier lines of rank 0 were dropped (size cap)`` in text, ``{"dropped": 1200,
"rank": 0}`` in JSON lines. A job that never ran answers 200 with no lines; another tenant's job 404.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime

from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from controlplane.domain import Invalid
from jobs import services
from jobs.api.schema import LOG_PARAMETERS
from runtime.backends.base import LogLine, LogPage
from tenants.permissions import RequireScope, request_tenant_id

MAX_LINES = 10_000
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no", "")
_CONTENT_TYPES = {"text": "text/plain; charset=utf-8", "jsonl": "application/x-ndjson; charset=utf-8"}


class _FormatIsNotARenderer(DefaultContentNegotiation):
    """``?format=`` chooses the log's own format here, not a DRF renderer (errors are JSON as anywhere)."""

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


def _count(raw: str | None, field: str, lowest: int, highest: int | None = None) -> int | None:
    if raw is None or raw == "":
        return None
    if not raw.isdigit() or int(raw) < lowest or (highest is not None and int(raw) > highest):
        bound = f" and at most {highest}" if highest is not None else ""
        raise Invalid(f"{field}: a whole number of at least {lowest}{bound}, got {raw!r}", field=field)
    return int(raw)


def _since(raw: str | None) -> str | float | None:
    if not raw:
        return None
    if raw.startswith("c"):
        return raw  # a cursor: the backend checks it
    try:
        moment = datetime.fromisoformat(raw.upper())  # RFC 3339 allows a lower-case t and z
    except ValueError:
        raise Invalid(
            f"since: an ISO 8601 time (2024-05-01T12:00:00Z) or a cursor from an earlier answer, got {raw!r}",
            field="since",
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def _choice(raw: str | None, field: str, choices: Iterable[str], default: str) -> str:
    value = (raw or default).lower()
    if value not in choices:
        raise Invalid(f"{field}: one of {', '.join(choices)}, got {raw!r}", field=field)
    return value


class LogRenderer:
    """Log lines as the chosen format's bytes."""

    def __init__(self, fmt: str, prefix_ranks: bool) -> None:
        self.fmt = fmt
        self.prefix_ranks = prefix_ranks

    def page(self, page: LogPage, with_cursor: bool = False) -> bytes:
        parts = [self._dropped(rank, count) for rank, count in sorted(page.dropped.items())]
        parts.extend(self._line(line) for line in page.lines)
        if with_cursor and self.fmt == "jsonl":
            parts.append(json.dumps({"cursor": page.cursor}))
        return "".join(f"{part}\n" for part in parts).encode()

    def _dropped(self, rank: int, count: int) -> str:
        if self.fmt == "jsonl":
            return json.dumps({"dropped": count, "rank": rank})
        return f"[polychip] {count} earlier lines of rank {rank} were dropped (size cap)"

    def _line(self, line: LogLine) -> str:
        if self.fmt == "jsonl":
            at = datetime.fromtimestamp(line.time, UTC).isoformat()
            return json.dumps({"t": at, "rank": line.rank, "stream": line.stream, "line": line.text})
        return f"[rank {line.rank}] {line.text}" if self.prefix_ranks else line.text


class JobLogsView(APIView):
    permission_classes = [RequireScope]
    content_negotiation_class = _FormatIsNotARenderer

    @extend_schema(
        summary="What the job's ranks wrote to stdout and stderr",
        parameters=LOG_PARAMETERS,
        responses={
            (200, "text/plain"): OpenApiResponse(OpenApiTypes.STR, description="One line per log line."),
            (200, "application/x-ndjson"): OpenApiResponse(
                OpenApiTypes.STR, description='One {"t", "rank", "stream", "line"} object per line.'
            ),
        },
    )
    def get(self, request: Request, job_id: int) -> HttpResponse | StreamingHttpResponse:
        params = request.query_params
        rank = _count(params.get("rank"), "rank", 0)
        attempt = _count(params.get("attempt"), "attempt", 0)
        tail = _count(params.get("tail"), "tail", 0, MAX_LINES)
        limit = _count(params.get("limit"), "limit", 1, MAX_LINES) or MAX_LINES
        since = _since(params.get("since"))
        fmt = _choice(params.get("format"), "format", _CONTENT_TYPES, "text")
        follow = _choice(params.get("follow"), "follow", (*_TRUE, *_FALSE), "false") in _TRUE
        logs = services.attempt_logs(tenant_id=request_tenant_id(request), job_id=job_id, attempt=attempt)
        renderer = LogRenderer(fmt, prefix_ranks=rank is None)
        headers = {"X-Log-Attempt": "" if logs.attempt is None else str(logs.attempt), "Cache-Control": "no-store"}
        if not follow or tail is not None:
            page = services.read_logs(logs, rank=rank, since=since, limit=limit, tail=tail)
            if not follow:
                response = HttpResponse(renderer.page(page), content_type=_CONTENT_TYPES[fmt], headers=headers)
                response["X-Log-Cursor"] = page.cursor
                response["X-Log-More"] = "true" if page.more else "false"
                if page.dropped:
                    response["X-Log-Dropped"] = ",".join(f"{r}:{n}" for r, n in sorted(page.dropped.items()))
                return response
            # Following from a tail: the tail first, then what comes after it.
            first, since = page, page.cursor or since
        else:
            first = None
        pages = services.follow_logs(logs, rank=rank, since=since)
        # A proxy must not hold the lines back (nginx buffers otherwise).
        headers["X-Accel-Buffering"] = "no"
        return StreamingHttpResponse(_stream(renderer, first, pages), content_type=_CONTENT_TYPES[fmt], headers=headers)


async def _stream(renderer: LogRenderer, first: LogPage | None, pages: AsyncIterator[LogPage]) -> AsyncIterator[bytes]:
    if first is not None and (first.lines or first.dropped):
        yield renderer.page(first, with_cursor=True)
    async for page in pages:
        yield renderer.page(page, with_cursor=True)
