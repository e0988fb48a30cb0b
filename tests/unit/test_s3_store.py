"""The S3 checkpoint store against a real S3 API (a moto server on localhost), and open_store's URLs."""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from runtime.jobspec import CheckpointSpec
from runtime.recovery.checkpoint import Checkpointer, checkpoint_name, find_restore, load, read_manifest
from runtime.recovery.store import ENDPOINT_ENV, S3Store, StoreError, open_store

PREFIX = "jobs/42/checkpoints"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    server_module = pytest.importorskip("moto.server", reason="moto[server] is not installed (pip install -e '.[dev]')")
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def fake_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials moto accepts, and no config of the machine's that could point boto3 elsewhere."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", ENDPOINT_ENV):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def client(s3_endpoint: str, fake_credentials: None) -> Any:
    boto3 = pytest.importorskip("boto3")
    return boto3.client("s3", endpoint_url=s3_endpoint)


@pytest.fixture
def bucket(client: Any) -> str:
    name = f"ckpt-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=name)
    return name


@pytest.fixture
def store(client: Any, bucket: str) -> S3Store:
    return S3Store(bucket, PREFIX, client=client)


def keys(client: Any, bucket: str) -> list[str]:
    response = client.list_objects_v2(Bucket=bucket)
    return sorted(obj["Key"] for obj in response.get("Contents", ()))


def trained(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(2):
        optimizer.zero_grad()
        model(torch.randn(16, 8)).square().mean().backward()
        optimizer.step()
    return model, optimizer


def assert_same_state(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert set(a) == set(b)
    for key in a:
        assert torch.equal(a[key], b[key])


def test_objects_live_under_the_prefix_and_the_manifest_commits(store: S3Store, client: Any, bucket: str):
    assert store.location == f"s3://{bucket}/{PREFIX}"
    assert store.names() == []
    store.commit("step-0000000001", {"weights.pt": b"w"}, b"{}")
    assert keys(client, bucket) == [f"{PREFIX}/step-0000000001/manifest.json", f"{PREFIX}/step-0000000001/weights.pt"]
    assert store.names() == ["step-0000000001"]
    assert store.read("step-0000000001", "weights.pt") == b"w"
    with pytest.raises(StoreError, match=r"cannot read optimizer\.pt of step-0000000001"):
        store.read("step-0000000001", "optimizer.pt")
    store.delete("step-0000000001")
    store.delete("step-0000000001")  # idempotent
    assert keys(client, bucket) == []


def test_round_trip_through_s3(store: S3Store):
    model, optimizer = trained()
    with Checkpointer(store, CheckpointSpec(weights_every=1, optimizer_every=2, keep=3)) as checkpointer:
        checkpointer.maybe_save(2, model, optimizer, {"data_position": 64})
    assert checkpointer.last_error is None
    assert checkpointer.records[0].bytes == sum(
        e.bytes for e in read_manifest(store, checkpoint_name(2)).files.values()
    )
    plan = find_restore(store)
    assert plan is not None
    assert (plan.weights_step, plan.optimizer_step, plan.meta) == (2, 2, {"data_position": 64})
    restored = load(store, plan)
    assert_same_state(model.state_dict(), restored.model_state)
    assert restored.optimizer_state is not None
    for original, loaded in zip(
        optimizer.state_dict()["state"].values(), restored.optimizer_state["state"].values(), strict=True
    ):
        assert torch.equal(original["momentum_buffer"], loaded["momentum_buffer"])


def test_a_corrupt_newest_checkpoint_is_skipped(store: S3Store, client: Any, bucket: str):
    model, optimizer = trained()
    older = {k: v.clone() for k, v in model.state_dict().items()}
    with Checkpointer(store, CheckpointSpec(weights_every=1, optimizer_every=2, keep=3), background=False) as saver:
        saver.save(2, "full", model, optimizer, {})
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(1.0)
        saver.save(3, "weights", model, None, {})
    key = f"{PREFIX}/{checkpoint_name(3)}/weights.pt"
    data = bytearray(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    data[-20] ^= 0xFF
    client.put_object(Bucket=bucket, Key=key, Body=bytes(data))
    plan = find_restore(store)
    assert plan is not None and (plan.weights_step, plan.optimizer_step) == (2, 2)
    assert plan.skipped[0][0] == checkpoint_name(3) and "sha256" in plan.skipped[0][1]
    assert_same_state(older, load(store, plan).model_state)


def test_retention_on_s3(store: S3Store, client: Any, bucket: str):
    model, optimizer = trained()
    with Checkpointer(store, CheckpointSpec(weights_every=1, optimizer_every=3, keep=1), background=False) as saver:
        for step in range(1, 6):
            saver.maybe_save(step, model, optimizer, {})
    assert store.names() == [checkpoint_name(3), checkpoint_name(5)]
    assert [r.deleted for r in saver.records] == [
        (),
        (checkpoint_name(1),),
        (checkpoint_name(2),),
        (),
        (checkpoint_name(4),),
    ]
    assert {key.split("/")[-2] for key in keys(client, bucket)} == {checkpoint_name(3), checkpoint_name(5)}


def test_a_torn_commit_is_never_listed_and_clean_partial_removes_it(store: S3Store, client: Any, bucket: str):
    store.commit(checkpoint_name(1), {"weights.pt": b"w"}, b"{}")
    client.put_object(Bucket=bucket, Key=f"{PREFIX}/{checkpoint_name(2)}/weights.pt", Body=b"half")
    client.put_object(Bucket=bucket, Key=f"{PREFIX}/{checkpoint_name(2)}/optimizer.pt", Body=b"half")
    client.put_object(Bucket=bucket, Key=f"{PREFIX}/deeper/not/ours.bin", Body=b"x")
    client.put_object(Bucket=bucket, Key="elsewhere/step-0000000009/weights.pt", Body=b"x")
    assert store.names() == [checkpoint_name(1)]
    assert store.clean_partial() == 1
    assert keys(client, bucket) == [
        "elsewhere/step-0000000009/weights.pt",
        f"{PREFIX}/deeper/not/ours.bin",
        f"{PREFIX}/{checkpoint_name(1)}/manifest.json",
        f"{PREFIX}/{checkpoint_name(1)}/weights.pt",
    ]
    assert store.clean_partial() == 0


def test_a_retry_of_the_same_name_leaves_nothing_of_the_old_one(store: S3Store, client: Any, bucket: str):
    store.commit(checkpoint_name(4), {"weights.pt": b"old", "optimizer.pt": b"old"}, b'{"old": 1}')
    store.commit(checkpoint_name(4), {"weights.pt": b"new"}, b'{"new": 1}')
    assert keys(client, bucket) == [
        f"{PREFIX}/{checkpoint_name(4)}/manifest.json",
        f"{PREFIX}/{checkpoint_name(4)}/weights.pt",
    ]
    assert json.loads(store.read(checkpoint_name(4), "manifest.json")) == {"new": 1}


def test_listing_and_deleting_page_through_many_objects(store: S3Store, client: Any, bucket: str):
    store.page_size = 2  # each listing takes several requests
    files = {f"shard-{i}.bin": bytes([i]) for i in range(5)}
    for step in (1, 2, 3):
        store.commit(checkpoint_name(step), files, b"{}")
    assert store.names() == [checkpoint_name(s) for s in (1, 2, 3)]
    store.delete(checkpoint_name(2))
    assert store.names() == [checkpoint_name(1), checkpoint_name(3)]
    assert len(keys(client, bucket)) == 12


def test_a_commit_to_a_missing_bucket_raises_a_store_error(store: S3Store, bucket: str):
    missing = S3Store(f"{bucket}-missing", PREFIX, client=store.client)
    with pytest.raises(StoreError, match="cannot"):
        missing.commit(checkpoint_name(1), {"weights.pt": b"w"}, b"{}")


def test_open_store_reaches_s3_through_the_url_or_the_environment(
    s3_endpoint: str, fake_credentials: None, client: Any, bucket: str, monkeypatch: pytest.MonkeyPatch
):
    via_url = open_store(f"s3://{bucket}/a/b/?endpoint={s3_endpoint}")
    assert isinstance(via_url, S3Store)
    assert (via_url.location, via_url.endpoint_url) == (f"s3://{bucket}/a/b", s3_endpoint)
    via_url.commit(checkpoint_name(1), {"weights.pt": b"w"}, b"{}")
    assert keys(client, bucket) == ["a/b/step-0000000001/manifest.json", "a/b/step-0000000001/weights.pt"]

    monkeypatch.setenv(ENDPOINT_ENV, s3_endpoint)
    via_env = open_store(f"s3://{bucket}/a/b")
    assert isinstance(via_env, S3Store) and via_env.endpoint_url == s3_endpoint
    assert via_env.names() == [checkpoint_name(1)]
    at_root = open_store(f"s3://{bucket}")
    assert isinstance(at_root, S3Store) and at_root.location == f"s3://{bucket}" and at_root.names() == []


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("s3://", "no bucket"),
        ("s3:///prefix", "no bucket"),
        ("s3:bucket/prefix", "two slashes"),
        ("s3://b/prefix", "must be 3-63"),
        ("s3://bucket/p?endpoint=ftp://host", "http:// or https://"),
        ("s3://bucket/p?endpoint=", "http:// or https://"),
        ("s3://bucket/p?region=eu", "unknown parameter 'region'"),
        ("s3://bucket/p?endpoint=http://a&endpoint=http://b", "once"),
        ("s3://bucket/p#frag", "fragment"),
    ],
)
def test_open_store_names_what_to_fix_in_a_bad_s3_url(url: str, hint: str):
    with pytest.raises(ValueError, match=hint):
        open_store(url)


def test_without_boto3_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "boto3", None)  # makes `import boto3` fail
    with pytest.raises(StoreError, match=r"pip install 'polychip\[s3\]'"):
        S3Store("bucket", "prefix")
