"""A rank's code bundle, fetched into its pod: the Kubernetes backend's init container runs this.

    python -m runtime.codefetch URL SHA256 DEST

It downloads the job's bundle from the control plane (``GET /api/v1/ingest/jobs/{id}/bundle``, with the
run's ingest token from ``POLYCHIP_TELEMETRY_TOKEN``; redirects are not followed, so the token goes
nowhere else), at most ``--max-bytes``, and unpacks it into DEST with ``runtime.bundles.extract_bundle``,
which checks every entry again and the bytes against the SHA-256 the job names: what runs is exactly
what the tenant uploaded, or nothing. DEST is made here (inside the pod's volume, whose own folder
belongs to root). Exit 0 when unpacked; 2 (the worker's "bad config", not retried) when the bundle was
refused or the control plane refused this run (401, 403, 404); 1 when it could not be fetched (retried
by recovery).
Plain Python: no Django here.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from runtime.bundles import BundleError, extract_bundle
from runtime.worker.config import TELEMETRY_TOKEN_ENV

CHUNK = 1024 * 1024
DEFAULT_MAX_BYTES = 512 * 1024 * 1024


def fetch(url: str, token: str, dest: Path, sha256: str, *, max_bytes: int = DEFAULT_MAX_BYTES) -> int:
    """Download and unpack; returns the bytes fetched. ``BundleError`` when the bundle is refused,
    ``OSError`` (``urllib.error.URLError``) when it cannot be fetched."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})  # noqa: S310 (http(s) only, below)
    if not url.startswith(("http://", "https://")):
        raise BundleError("url", f"{url!r} is not an http(s) URL")
    opener = urllib.request.build_opener(_NoRedirects)
    with tempfile.NamedTemporaryFile(suffix=".tar.gz") as archive:
        size = 0
        try:
            response = opener.open(request, timeout=60)
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403, 404):
                raise BundleError("bundle", f"the control plane answered {exc.code} for {url}") from None
            raise
        with response:
            while chunk := response.read(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise BundleError(
                        "bundle", f"larger than {max_bytes} bytes; the control plane refuses such uploads"
                    )
                archive.write(chunk)
        archive.flush()
        extract_bundle(Path(archive.name), dest, expected_sha256=sha256.removeprefix("sha256:"))
    return size


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a redirect is an error here: the token is for the control plane alone


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("sha256")
    parser.add_argument("dest", type=Path)
    parser.add_argument("--max-bytes", type=int, default=DEFAULT_MAX_BYTES)
    args = parser.parse_args(argv)
    token = os.environ.get(TELEMETRY_TOKEN_ENV, "")
    try:
        size = fetch(args.url, token, args.dest, args.sha256, max_bytes=args.max_bytes)
    except BundleError as exc:
        sys.stderr.write(f"polychip code: the bundle was refused: {exc}\n")
        return 2
    except (OSError, urllib.error.URLError) as exc:
        sys.stderr.write(f"polychip code: could not fetch {args.url}: {exc}\n")
        return 1
    sys.stdout.write(f"polychip code: {size} bytes fetched and unpacked into {args.dest}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
