"""Idempotency-Key: the same request again gets the same answer, once (Stripe's and the IETF draft's rules).

A request that carries a key is claimed before its view runs, by inserting its row; the unique
constraint on (principal, key) makes exactly one of several racing requests the owner. Then:

- the same key with the same request (method, path and canonical body): the stored answer again, or
  409 while the first is still running;
- the same key with another request: 422;
- a refusal (4xx) or failure (5xx), or an answer that streams, is not kept: the claim is released, so
  a retry runs again;
- a claim still in flight after ``ABANDONED_AFTER`` belongs to a process that died: the next request
  takes it over with a conditional UPDATE (exactly one can), and runs.

Keys are kept ``POLYCHIP_IDEMPOTENCY_TTL_HOURS`` (24 by default), then purged.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from tenants.models import IdempotencyKey

ABANDONED_AFTER = timedelta(seconds=60)
MAX_KEY_LENGTH = 255
# The answer's headers a replay gives back (the rest are the server's of the moment).
KEPT_HEADERS = ("Content-Type", "Location", "X-Log-Cursor")


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be an Idempotency-Key, or None."""
    if not 1 <= len(key) <= MAX_KEY_LENGTH or not all(" " <= c <= "~" for c in key):
        return f"1 to {MAX_KEY_LENGTH} printable ASCII characters (a UUID will do), got {len(key)} characters"
    return None


def fingerprint(method: str, path: str, content_type: str, body: bytes) -> str:
    """The request's identity: a JSON body by its meaning (keys sorted, no white space), another by its bytes."""
    canonical = body
    if content_type.split(";")[0].strip().lower() == "application/json" and body:
        # Not JSON after all: the view will say so, and the bytes identify it.
        with contextlib.suppress(ValueError):
            canonical = json.dumps(json.loads(body), sort_keys=True, separators=(",", ":")).encode()
    digest = hashlib.sha256()
    for part in (method.upper().encode(), path.encode(), canonical):
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()


@dataclass(frozen=True)
class Claim:
    """What to do with a request: ``run`` it (the row is ours), ``replay`` the stored answer, or refuse
    (``conflict`` 409: still in flight; ``mismatch`` 422: the key was used for another request)."""

    outcome: str
    row_id: int | None = None
    status_code: int = 0
    headers: dict[str, str] | None = None
    body: bytes = b""


def claim(*, principal: str, key: str, tenant_id: int | None, fingerprint: str) -> Claim:
    now = timezone.now()
    try:
        with transaction.atomic():
            created = IdempotencyKey.objects.create(
                principal=principal, key=key, tenant_id=tenant_id, fingerprint=fingerprint, claimed_at=now
            )
        return Claim("run", created.pk)
    except IntegrityError:
        pass
    row = IdempotencyKey.objects.filter(principal=principal, key=key).first()
    if row is None:  # purged between the insert and the read: claim it again
        return claim(principal=principal, key=key, tenant_id=tenant_id, fingerprint=fingerprint)
    if row.fingerprint != fingerprint:
        return Claim("mismatch")
    if row.state == IdempotencyKey.State.DONE:
        return Claim("replay", row.pk, row.status_code or 200, dict(row.headers), bytes(row.body))
    taken = IdempotencyKey.objects.filter(
        pk=row.pk, state=IdempotencyKey.State.IN_FLIGHT, claimed_at=row.claimed_at, claimed_at__lt=now - ABANDONED_AFTER
    ).update(claimed_at=now)
    return Claim("run", row.pk) if taken else Claim("conflict")


def store(row_id: int, status_code: int, headers: dict[str, str], body: bytes) -> None:
    IdempotencyKey.objects.filter(pk=row_id).update(
        state=IdempotencyKey.State.DONE, status_code=status_code, headers=headers, body=body
    )


def release(row_id: int) -> None:
    IdempotencyKey.objects.filter(pk=row_id, state=IdempotencyKey.State.IN_FLIGHT).delete()


def purge_expired(now: datetime | None = None) -> int:
    """Forget keys older than the retention; how many."""
    hours = settings.POLYCHIP_IDEMPOTENCY_TTL_HOURS
    cutoff = (now or timezone.now()) - timedelta(hours=hours)
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=cutoff).delete()
    return deleted
