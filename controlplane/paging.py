"""Cursor pages for the API's lists (jobs, events, tokens, invoices, usage).

A page is ``limit`` rows (``DEFAULT_LIMIT`` unless asked, at most ``MAX_LIMIT``) in the list's fixed
order of ids, and the cursor of the next page names the last id given: the next page starts after it
(keyset paging, as DRF's CursorPagination does). Rows added or removed meanwhile neither repeat nor
skip a row that was there, and page 1,000 costs what page 1 does. The answer says where the next page
is in the body (``next_cursor``, ``next``) and in a ``Link: <...>; rel="next"`` header; there is
no next page exactly when ``next_cursor`` is null, so nothing is ever cut off silently.

A list's service takes ``after`` and ``limit`` and returns up to ``limit + 1`` rows: the extra row
only says that there is more.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import urlencode

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.domain import Invalid

DEFAULT_LIMIT = 50
MAX_LIMIT = 500
# A cursor says where the next page starts, plainly ("k" and an id): opaque to nobody, and exactly
# described by its pattern, so that any cursor the schema allows is one the API takes.
_CURSOR_PREFIX = "k"
CURSOR_PATTERN = r"^k[0-9]{1,18}$"

T = TypeVar("T")


@dataclass(frozen=True)
class PageRequest:
    limit: int
    after: int | None  # the last id of the page before; None for the first page


def encode_cursor(last_id: int) -> str:
    return f"{_CURSOR_PREFIX}{last_id}"


def decode_cursor(raw: str) -> int:
    if re.fullmatch(CURSOR_PATTERN, raw) is None:
        raise Invalid(
            f"cursor: {raw[:40]!r} is not a cursor this API gave; pass the next_cursor of the page before, "
            "or leave cursor out for the first page",
            field="cursor",
        )
    return int(raw.removeprefix(_CURSOR_PREFIX))


def whole_number(params: Mapping[str, str], name: str, *, lowest: int, highest: int) -> int | None:
    raw = params.get(name)
    if raw is None:
        return None
    # The length first: int() of thousands of digits is refused by Python itself (a 500, not a 400).
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 18 or not lowest <= int(raw) <= highest:
        raise Invalid(f"{name}: a whole number from {lowest} to {highest}, got {raw[:40]!r}", field=name)
    return int(raw)


def moment(params: Mapping[str, str], name: str) -> datetime | None:
    """An RFC 3339 time from the query, in UTC (lower-case t and z allowed; no zone means UTC).

    Absent is None; present but empty is refused like any other text that is not a time."""
    raw = params.get(name)
    if raw is None:
        return None
    try:
        value = datetime.fromisoformat(raw.upper())
        # In UTC here: PostgreSQL takes no zone offset past 15:59, which ISO 8601 allows up to 23:59.
        return value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
    except (ValueError, OverflowError):
        raise Invalid(f"{name}: an RFC 3339 time such as 2026-05-01T12:00:00Z, got {raw[:40]!r}", field=name) from None


def page_request(params: Mapping[str, str], *, default: int = DEFAULT_LIMIT, maximum: int = MAX_LIMIT) -> PageRequest:
    limit = whole_number(params, "limit", lowest=1, highest=maximum)
    cursor = params.get("cursor")  # empty: the first page, like none
    return PageRequest(limit=limit or default, after=decode_cursor(cursor) if cursor else None)


def page_response(
    request: Request,
    key: str,
    rows: Sequence[T],
    page: PageRequest,
    *,
    row_id: Callable[[T], int],
    render: Callable[[T], Any],
    extra: Mapping[str, Any] | None = None,
) -> Response:
    """The page's rows under ``key`` with where the next page is; ``rows`` as the service gave them
    (``limit + 1`` of them when there is more)."""
    shown = list(rows[: page.limit])
    following = encode_cursor(row_id(shown[-1])) if len(rows) > page.limit and shown else None
    link = None
    if following is not None:
        query = {name: value for name, value in request.query_params.items() if name != "cursor"}
        link = f"{request.path}?{urlencode({**query, 'cursor': following})}"
    body = {
        **(extra or {}),
        key: [render(row) for row in shown],
        "limit": page.limit,
        "next_cursor": following,
        "next": link,
    }
    return Response(body, headers={"Link": f'<{link}>; rel="next"'} if link else None)


def page_parameters(maximum: int = MAX_LIMIT, default: int = DEFAULT_LIMIT) -> list[OpenApiParameter]:
    """The query parameters of a cursor page (the usage ledger takes larger pages than the rest)."""
    return [
        OpenApiParameter(
            "limit",
            {"type": "integer", "minimum": 1, "maximum": maximum},
            OpenApiParameter.QUERY,
            description=f"Rows per page: {default} unless asked, at most {maximum}.",
        ),
        OpenApiParameter(
            "cursor",
            OpenApiTypes.STR,
            OpenApiParameter.QUERY,
            description="The next_cursor of the page before; absent for the first page.",
            pattern=f"^({CURSOR_PATTERN.strip('^$')})?$",  # or empty: the first page
        ),
    ]


PAGE_PARAMETERS = page_parameters()
