"""Schemathesis hooks for tests/integration/test_api_fuzz.py (loaded through SCHEMATHESIS_HOOKS).

A real client sends a new Idempotency-Key for each new request and the same one only when it retries
that request. The fuzzer draws header values from a small space and would send one key with many
different requests, each then rightly refused with 422. So a key that is a valid one is made unique
per request here; an invalid one is kept, so that its 400 is still exercised.
"""

from __future__ import annotations

import uuid
from typing import Any

import schemathesis

HEADER = "Idempotency-Key"


def _valid(key: str) -> bool:
    return 1 <= len(key) <= 255 and all(" " <= c <= "~" for c in key)


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    headers = case.headers
    if headers and isinstance(headers.get(HEADER), str) and _valid(headers[HEADER]):
        headers[HEADER] = str(uuid.uuid4())
