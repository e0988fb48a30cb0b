"""Code bundles through the API on PostgreSQL: upload (raw body or form), the same bytes again, list, read,
tenants kept apart, and every refusal answered 400 (or 413) with nothing left on disk or in the table."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from controlplane.domain import Invalid
from jobs import services
from jobs.models import Bundle

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

TRAIN = b"def main():\n    print('training')\n"


def tar_gz(files: dict[str, bytes], *, links: dict[str, str] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buffer.getvalue()


GOOD = tar_gz({"train.py": TRAIN, "pkg/__init__.py": b"", "pkg/model.py": b"class Model: ...\n"})


@pytest.fixture
def store(settings, tmp_path: Path) -> Path:
    settings.POLYCHIP_BUNDLES_DIR = tmp_path / "bundles"
    settings.POLYCHIP_BUNDLE_MAX_BYTES = 1024 * 1024
    return tmp_path / "bundles"


def bearer(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def upload_raw(client: APIClient, body: bytes, name: str = "", content_type: str = "application/gzip"):
    url = "/api/v1/bundles" + (f"?name={name}" if name else "")
    return client.post(url, body, content_type=content_type)


def upload_form(client: APIClient, body: bytes, name: str | None = None, field: str = "bundle"):
    data: dict[str, object] = {field: io.BytesIO(body)}
    data[field].name = "code.tar.gz"  # type: ignore[attr-defined]
    if name is not None:
        data["name"] = name
    return client.post("/api/v1/bundles", data, format="multipart")


def stored_files(store: Path) -> list[str]:
    """Everything under the store, temporary files included (their names start with a dot)."""
    return sorted(str(p.relative_to(store)) for p in store.rglob("*") if not p.is_dir()) if store.exists() else []


# --- uploads --------------------------------------------------------------------------------------


def test_upload_stores_the_bundle_by_its_address(tenants, store):
    acme = tenants[0]
    response = upload_raw(bearer(acme.token), GOOD, name="my-code")
    assert response.status_code == 201, response.content
    body = response.json()
    sha = body["sha256"]
    assert body["bundle"] == f"sha256:{sha}"
    assert response["Location"] == f"/api/v1/bundles/{sha}"
    assert body["size_bytes"] == len(GOOD)
    assert body["files"] == 3
    assert body["unpacked_bytes"] == len(TRAIN) + len(b"class Model: ...\n")
    assert body["name"] == "my-code"
    assert body["entries"] == ["pkg/__init__.py", "pkg/model.py", "train.py"]
    assert body["created_at"]

    path = store / str(acme.id) / f"{sha}.tar.gz"
    assert path.read_bytes() == GOOD
    assert stored_files(store) == [f"{acme.id}/{sha}.tar.gz"]
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(store).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(store / str(acme.id)).st_mode) == 0o700
    row = Bundle.objects.get(tenant_id=acme.id, sha256=sha)
    assert row.uploaded_by == get_user_model().objects.get(username=acme.username)
    assert (row.size_bytes, row.files, row.name) == (len(GOOD), 3, "my-code")


def test_the_same_bytes_again_are_the_same_bundle(tenants, store):
    client = bearer(tenants[0].token)
    first = upload_raw(client, GOOD, name="first")
    again = upload_raw(client, GOOD, name="second")
    as_form = upload_form(client, GOOD, name="third")
    assert first.status_code == 201
    assert (again.status_code, as_form.status_code) == (200, 200), (again.content, as_form.content)
    assert first.json()["sha256"] == again.json()["sha256"] == as_form.json()["sha256"]
    assert again.json()["name"] == "first"  # the bundle was stored once, under its first name
    assert Bundle.objects.filter(tenant_id=tenants[0].id).count() == 1
    assert len(stored_files(store)) == 1


def test_a_form_upload_and_octet_stream_both_work(tenants, store):
    client = bearer(tenants[0].token)
    form = upload_form(client, tar_gz({"a.py": b"a = 1\n"}))
    assert form.status_code == 201, form.content
    assert form.json()["name"] == "code.tar.gz"  # the form's file name, when no name is given
    raw = upload_raw(client, tar_gz({"b.py": b"b = 2\n"}), content_type="application/octet-stream")
    assert raw.status_code == 201, raw.content


def test_list_and_read(tenants, store):
    client = bearer(tenants[0].token)
    older = upload_raw(client, GOOD, name="older").json()
    newer = upload_raw(client, tar_gz({"other.py": b"x = 1\n"}), name="newer").json()
    listed = client.get("/api/v1/bundles")
    assert listed.status_code == 200
    assert [b["bundle"] for b in listed.json()["bundles"]] == [newer["bundle"], older["bundle"]]
    assert "entries" not in listed.json()["bundles"][0]  # a listing reads only the rows
    one = client.get(f"/api/v1/bundles/{older['sha256']}")
    assert one.status_code == 200
    assert one.json()["entries"] == ["pkg/__init__.py", "pkg/model.py", "train.py"]
    assert client.get(f"/api/v1/bundles/sha256:{older['sha256']}").json()["name"] == "older"
    assert client.get("/api/v1/bundles/" + "0" * 64).status_code == 404
    assert client.get("/api/v1/bundles/not-a-sha").status_code == 404


def test_another_tenant_sees_nothing(tenants, store):
    acme, globex, _ = tenants
    sha = upload_raw(bearer(acme.token), GOOD, name="acme-secret-code").json()["sha256"]
    other = bearer(globex.token)
    response = other.get(f"/api/v1/bundles/{sha}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
    assert other.get("/api/v1/bundles").json() == {"bundles": []}
    # The same bytes from another tenant are that tenant's own new bundle: nobody learns what others hold.
    theirs = upload_raw(other, GOOD)
    assert theirs.status_code == 201
    assert (store / str(globex.id) / f"{sha}.tar.gz").exists()
    with pytest.raises(Invalid) as caught:
        services.bundle_path(tenant_id=tenants[2].id, ref=f"sha256:{sha}")
    assert caught.value.field == "workload.bundle" and "no such bundle" in caught.value.message


def test_uploading_needs_the_submit_scope(tenants, store):
    from tenants import services as tenancy

    acme = tenants[0]
    reader = tenancy.issue_token(tenant_id=acme.id, username=acme.username, name="reader", scopes=["read"]).secret
    response = upload_raw(bearer(reader), GOOD)
    assert response.status_code == 403
    assert "'submit' scope" in response.json()["error"]["message"]
    assert bearer(reader).get("/api/v1/bundles").status_code == 200
    assert stored_files(store) == [] and not Bundle.objects.exists()


# --- refusals: nothing stored ----------------------------------------------------------------------


def bad_bundles() -> list[object]:
    return [
        pytest.param(tar_gz({"train.py": TRAIN, "../x": b"boom"}), "'..'", id="path-traversal"),
        pytest.param(tar_gz({"train.py": TRAIN, "/etc/x": b"boom"}), "absolute path", id="absolute-path"),
        pytest.param(tar_gz({"train.py": TRAIN}, links={"pw": "/etc/passwd"}), "absolute path", id="symlink-absolute"),
        pytest.param(tar_gz({"train.py": TRAIN}, links={"a": "../../x"}), "outside the bundle", id="symlink-escape"),
        pytest.param(b"print('not an archive')\n" * 10, "not a tar.gz: it is not gzip-compressed", id="not-gzip"),
        pytest.param(gzip.compress(b"plain text\n" * 100), "not a tar archive", id="gzip-not-tar"),
        pytest.param(GOOD[:-30], "not a tar.gz", id="cut-short"),
        pytest.param(tar_gz({}, links={"a": "b"}), "holds no files", id="no-files"),
        pytest.param(b"", "the upload is empty", id="empty"),
    ]


@pytest.mark.parametrize(("body", "words"), bad_bundles())
def test_a_bad_bundle_is_refused_and_nothing_is_stored(tenants, store, body: bytes, words: str):
    response = upload_raw(bearer(tenants[0].token), body)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == "bundle"
    assert error["code"] == "invalid_bundle"
    assert words in error["message"], error["message"]
    assert stored_files(store) == []
    assert not Bundle.objects.exists()


def test_a_form_without_the_bundle_field_is_refused(tenants, store):
    response = upload_form(bearer(tenants[0].token), GOOD, field="file")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "bundle"
    assert "field 'bundle'" in response.json()["error"]["message"]
    assert stored_files(store) == [] and not Bundle.objects.exists()


def test_a_body_that_is_not_an_archive_type_is_refused(tenants, store):
    response = bearer(tenants[0].token).post("/api/v1/bundles", {"bundle": "x"}, format="json")
    assert response.status_code == 400
    assert "application/gzip" in response.json()["error"]["message"]
    assert stored_files(store) == [] and not Bundle.objects.exists()


def test_over_the_limit_is_413_and_nothing_is_stored(tenants, store, settings):
    settings.POLYCHIP_BUNDLE_MAX_BYTES = len(GOOD) - 1
    client = bearer(tenants[0].token)
    for response in (upload_raw(client, GOOD), upload_form(client, GOOD)):
        assert response.status_code == 413, response.content
        error = response.json()["error"]
        assert (error["code"], error["field"]) == ("too_large", "bundle")
        assert f"larger than {len(GOOD) - 1} bytes" in error["message"]
    assert stored_files(store) == [] and not Bundle.objects.exists()


def test_a_stream_past_the_limit_is_cut_off_and_nothing_is_stored(tenants, store, settings):
    """A body of unknown length (chunked) is counted as it arrives and refused once it passes the limit."""
    settings.POLYCHIP_BUNDLE_MAX_BYTES = len(GOOD) - 1
    with pytest.raises(services.BundleRefused) as caught:
        services.store_bundle(tenant_id=tenants[0].id, user_id=None, upload_file=io.BytesIO(GOOD), name="")
    assert caught.value.code == "too_large" and caught.value.field == "bundle"
    assert stored_files(store) == [] and not Bundle.objects.exists()


# --- what a job's spec names ----------------------------------------------------------------------


def test_bundle_path_and_entrypoint_for_a_job(tenants, store):
    acme = tenants[0]
    ref = upload_raw(bearer(acme.token), GOOD).json()["bundle"]
    path = services.bundle_path(tenant_id=acme.id, ref=ref)
    assert path == store / str(acme.id) / f"{ref.removeprefix('sha256:')}.tar.gz"
    assert services.bundle_entrypoint(tenant_id=acme.id, ref=ref, entrypoint="pkg.model:main") == "pkg/model.py"
    assert services.bundle_entrypoint(tenant_id=acme.id, ref=ref, entrypoint="train.py") == "train.py"
    with pytest.raises(Invalid) as caught:
        services.bundle_entrypoint(tenant_id=acme.id, ref=ref, entrypoint="src/run.py")
    assert caught.value.field == "workload.entrypoint" and "pkg/model.py" in caught.value.message

    for bad in ("sha256:xyz", ref.removeprefix("sha256:"), "SHA256:" + ref[7:].upper(), ""):
        with pytest.raises(Invalid) as caught:
            services.bundle_path(tenant_id=acme.id, ref=bad)
        assert caught.value.field == "workload.bundle" and "sha256:<64 hex digits>" in caught.value.message
    with pytest.raises(Invalid, match="no such bundle"):
        services.bundle_path(tenant_id=acme.id, ref="sha256:" + "0" * 64)
    path.unlink()
    with pytest.raises(Invalid, match=r"upload the same tar\.gz again"):
        services.bundle_path(tenant_id=acme.id, ref=ref)


def test_the_body_limit_lets_a_whole_bundle_and_its_form_through():
    from django.conf import settings

    from controlplane.body_limit import UPLOAD_FRAMING_BYTES

    limit = settings.POLYCHIP_UPLOAD_LIMITS["/api/v1/bundles"]
    assert limit == settings.POLYCHIP_BUNDLE_MAX_BYTES + UPLOAD_FRAMING_BYTES
