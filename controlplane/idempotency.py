"""``Idempotency-Key`` on every request under /api/ that changes something (POST, PUT, PATCH, DELETE).

A CI step that timed out and runs again must not submit its job twice. A client sends a key of its
choosing with the request; this middleware finds whose it is (the API token or the signed-in user, the
same principal the view will see), and lets ``tenants.idempotency`` decide: run the view and keep its
answer when it did something (2xx), give the kept answer again (``Idempotency-Replayed: true``), or
refuse (409 still in flight, 422 the key was used for another request, 400 a key that is not one). A
request without the header, or from nobody the API would let in, passes untouched (the view answers).

The request's identity is its method, its path with the query, and its body: JSON by its meaning
(keys in any order), anything else by its bytes' sha256.

A view that answered without changing anything (a dry run) marks its answer with ``changed_nothing``:
the key is then released as after a refusal, so that a dry run never uses up the key that the real
request will carry.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable
from typing import TypeVar

from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse

from tenants import services as tenants

HEADER = "Idempotency-Key"
_CHANGING = ("POST", "PUT", "PATCH", "DELETE")
_CHUNK = 1024 * 1024
_SPOOL_IN_MEMORY = 4 * 1024 * 1024


_UNCHANGED = "polychip_changed_nothing"
_Response = TypeVar("_Response", bound=HttpResponseBase)


def changed_nothing(response: _Response) -> _Response:
    """Mark ``response`` as the answer of a request that changed nothing: its Idempotency-Key is not kept."""
    setattr(response, _UNCHANGED, True)
    return response


def _refusal(status: int, code: str, message: str) -> JsonResponse:
    return JsonResponse({"error": {"code": code, "message": message, "field": HEADER}}, status=status)


def _principal(request: HttpRequest) -> tuple[str, int | None] | None:
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    if scheme == "Bearer" and secret.strip().startswith(tenants.TOKEN_PREFIX):
        token = tenants.authenticate_token(secret.strip())
        setattr(request, tenants.AUTHENTICATED_TOKEN, token)  # the API's authentication looks no further
        return (f"token:{token.pk}", token.tenant_id) if token is not None else None
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}", None
    return None


def _body_identity(request: HttpRequest) -> bytes:
    """What identifies the body: JSON by its bytes (canonicalised later); a form by its fields and its
    files' sha256 (not its random boundary, so that curl -F sending the same file again is the same
    request); any other body (a bundle's tar.gz) by its sha256, taken while it is copied to a spooled
    file that the view then reads in its place. An upload is never held whole in memory."""
    content_type = request.content_type or ""
    if content_type == "application/json":
        return request.body
    if content_type == "multipart/form-data":
        # Parsed here, once: DRF's request takes Django's parsed form when the body was read before it.
        parts = [f"{name}={value}" for name, value in sorted(request.POST.lists())]
        for name in sorted(request.FILES):
            for upload in request.FILES.getlist(name):
                digest = hashlib.sha256()
                for chunk in upload.chunks():
                    digest.update(chunk)
                upload.seek(0)
                parts.append(f"{name}:{upload.name}:{digest.hexdigest()}")
        return "\n".join([content_type, *parts]).encode()
    digest = hashlib.sha256()
    spool = tempfile.SpooledTemporaryFile(max_size=_SPOOL_IN_MEMORY)  # noqa: SIM115 (the request owns it now)
    while chunk := request.read(_CHUNK):
        digest.update(chunk)
        spool.write(chunk)
    spool.seek(0)
    # Django reads a body through the request's stream; once read, the view reads this copy instead.
    request._stream = spool  # type: ignore[assignment]
    request._read_started = False  # type: ignore[attr-defined]
    return f"{content_type}:{digest.hexdigest()}".encode()


class IdempotencyKeyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        key = request.headers.get(HEADER)
        if key is None or request.method not in _CHANGING or not request.path.startswith("/api/"):
            return self.get_response(request)
        who = _principal(request)
        if who is None:
            return self.get_response(request)
        if (problem := tenants.idempotency_key_problem(key)) is not None:
            return _refusal(400, "invalid", f"{HEADER}: {problem}")
        principal, tenant_id = who
        fingerprint = tenants.idempotency_fingerprint(
            request.method or "", request.get_full_path(), request.content_type or "", _body_identity(request)
        )
        claim = tenants.claim_idempotency_key(
            principal=principal, key=key, tenant_id=tenant_id, fingerprint=fingerprint
        )
        if claim.outcome == "mismatch":
            return _refusal(
                422, "idempotency_key_reused", f"{HEADER} {key!r} was used for another request; use a new key for it"
            )
        if claim.outcome == "conflict":
            return _refusal(
                409,
                "idempotency_key_in_flight",
                f"a request with {HEADER} {key!r} is still running; retry when it ends",
            )
        if claim.outcome == "replay":
            replayed = HttpResponse(claim.body, status=claim.status_code)
            for name, value in (claim.headers or {}).items():
                replayed[name] = value
            replayed["Idempotency-Replayed"] = "true"
            return replayed
        assert claim.row_id is not None  # noqa: S101 (outcome "run" always names its row)
        try:
            response = self.get_response(request)
        except BaseException:
            tenants.release_idempotency_key(claim.row_id)
            raise
        unchanged = getattr(response, _UNCHANGED, False)
        if unchanged or response.status_code >= 400 or response.streaming or not isinstance(response, HttpResponse):
            # A refusal changed nothing, and may not be the answer later (the bundle it lacked is
            # uploaded since, the server is back): not kept, so a retry runs again (Stripe keeps no
            # validation failure either). Nor is a dry run's answer: the key stays free for the real request.
            tenants.release_idempotency_key(claim.row_id)
            return response
        headers = {name: response[name] for name in tenants.IDEMPOTENCY_KEPT_HEADERS if response.has_header(name)}
        tenants.store_idempotency_answer(claim.row_id, response.status_code, headers, response.content)
        return response
