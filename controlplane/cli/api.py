"""The REST API as the CLI speaks it (httpx): every answer or failure turned into data or one ``CliError``.

A request that may be sent twice safely (a read, or a write that carries an ``Idempotency-Key``) is
sent again after a dropped connection, a timeout or a 502/503/504, a few times with backoff; the
server's idempotency makes the retried write land once. Nothing here prints.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from typing import Any

import httpx

from controlplane.cli import exitcodes
from controlplane.cli.errors import CliError

RETRIES = 3
BACKOFF_S = (0.5, 1.0, 2.0)  # before each of the RETRIES
_TRANSIENT_STATUS = (502, 503, 504)


def _problem(response: httpx.Response) -> tuple[str, str | None, str, list[dict[str, str]]]:
    """The error shape's code, field, message and list, or the body's start when it is not one."""
    try:
        error = response.json()["error"]
        return error.get("code", ""), error.get("field"), error["message"], list(error.get("errors") or [])
    except (ValueError, KeyError, TypeError):
        return "", None, response.text[:300].strip() or response.reason_phrase, []


def refusal(response: httpx.Response, url: str) -> CliError:
    """The one line a user reads for an answer of 4xx or 5xx, and the exit code it means."""
    code, field, message, errors = _problem(response)
    status = response.status_code
    if status == 401:
        return CliError(
            exitcodes.ERROR,
            f"{url} refused the token (401: {message}); run `polychip login` or set POLYCHIP_TOKEN to a live token",
        )
    if status == 404:
        return CliError(exitcodes.NOT_FOUND, f"not found: {message}")
    if code == "never_fits":
        return CliError(exitcodes.REFUSED, f"refused: {message}")
    if status == 400 and len(errors) > 1:
        lines = "; ".join(f"{e.get('field')}: {e.get('message')}" for e in errors)
        return CliError(exitcodes.USAGE, f"the API refused the request ({len(errors)} problems): {lines}")
    if status in (400, 413, 422):
        where = f"{field}: " if field and not message.startswith(f"{field}:") else ""
        return CliError(exitcodes.USAGE, f"the API refused the request: {where}{message}")
    return CliError(exitcodes.ERROR, f"HTTP {status} from {url}: {message}")


class Api:
    def __init__(self, url: str, token: str | None, *, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        headers["User-Agent"] = "polychip-cli"
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout_s)

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else {}
        attempts = RETRIES + 1 if method == "GET" or idempotency_key is not None else 1
        timeout = timeout_s if timeout_s is not None else httpx.USE_CLIENT_DEFAULT
        for attempt in range(attempts):
            if attempt:
                time.sleep(BACKOFF_S[attempt - 1])
            last = attempt == attempts - 1
            try:
                response = self.http.request(method, path, json=json, params=params, headers=headers, timeout=timeout)
            except httpx.TransportError as exc:
                if last:
                    raise self._unreachable(exc) from None
                continue
            if response.status_code in _TRANSIENT_STATUS and not last:
                continue
            if response.status_code >= 400:
                raise refusal(response, self.url)
            return response.json() if response.content.strip() else None
        raise AssertionError("not reached: the last attempt returns or raises")

    def _unreachable(self, exc: httpx.TransportError) -> CliError:
        if isinstance(exc, httpx.TimeoutException):
            return CliError(exitcodes.ERROR, f"no answer from {self.url} in time ({type(exc).__name__}); try again")
        if isinstance(exc, httpx.ConnectError):
            return CliError(
                exitcodes.ERROR,
                f"cannot reach Polychip at {self.url} ({exc}); start it with `make up`, or point --url or "
                "POLYCHIP_URL at it",
            )
        return CliError(exitcodes.ERROR, f"the connection to {self.url} failed: {exc}")

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: Any = None, *, idempotency_key: str | None = None) -> Any:
        return self.request("POST", path, json=body, idempotency_key=idempotency_key)

    def pages(self, path: str, key: str, *, limit: int | None, **params: Any) -> Iterator[dict[str, Any]]:
        """The rows of a list, following its pages; ``limit`` rows at most (None: all)."""
        query: dict[str, Any] = {k: v for k, v in params.items() if v is not None}
        query["limit"] = min(limit, 500) if limit else 500
        given = 0
        page = self.request("GET", path, params=query)
        while True:
            for row in page[key]:
                if limit is not None and given >= limit:
                    return
                given += 1
                yield row
            following = page.get("next")
            if not following or (limit is not None and given >= limit):
                return
            page = self.request("GET", following)

    # The job routes the CLI and the benches use.

    def submit(self, spec: Any, *, idempotency_key: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = self.post("/api/v1/jobs", spec, idempotency_key=idempotency_key)
        return result

    def advise(self, spec: Any, *, dry_run: bool = False) -> dict[str, Any]:
        """The advisor's answer on ``spec``; ``dry_run`` asks submit itself (its checks, then the advice)."""
        if dry_run:
            result: dict[str, Any] = self.request("POST", "/api/v1/jobs", json=spec, params={"dry_run": "true"})
        else:
            result = self.post("/api/v1/jobs/advise", spec)
        return result

    def job(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/api/v1/jobs/{job_id}")
        return result

    def cancel(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.post(f"/api/v1/jobs/{job_id}/cancel")
        return result

    def usage(self, job_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.get(f"/api/v1/jobs/{job_id}/usage")
        return result

    def wait(self, job_id: int, *, until: str | None, timeout_s: float) -> dict[str, Any]:
        """One long poll of the wait route: the job once it is in ``until``, or when the time is up."""
        params = {"timeout": f"{timeout_s:.1f}", **({"until": until} if until else {})}
        result: dict[str, Any] = self.request(
            "GET", f"/api/v1/jobs/{job_id}/wait", params=params, timeout_s=timeout_s + 30
        )
        return result

    def stream(self, path: str, **params: Any) -> Iterator[bytes]:
        """A streamed answer's bytes as they come (logs followed)."""
        try:
            with self.http.stream("GET", path, params=params, timeout=httpx.Timeout(30, read=None)) as response:
                if response.status_code >= 400:
                    response.read()
                    raise refusal(response, self.url)
                yield from response.iter_bytes()
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
