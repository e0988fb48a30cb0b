"""The CLI's own rules, without a server: idempotency keys, web workers, and its import weight."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from controlplane.cli.main import derive_idempotency_key
from controlplane.cli.server import _web_workers

SPEC = {"name": "a", "devices": 1, "flavors": ["tpu-v4"]}


def test_a_key_comes_from_the_spec_and_the_ci_run(monkeypatch):
    for name in ("POLYCHIP_RUN_ID", "GITHUB_RUN_ID", "CI_PIPELINE_ID", "BUILD_TAG"):
        monkeypatch.delenv(name, raising=False)
    assert derive_idempotency_key(SPEC, None) != derive_idempotency_key(SPEC, None)  # no run: one per call
    assert derive_idempotency_key(SPEC, "mine") == "mine"
    monkeypatch.setenv("GITHUB_RUN_ID", "7")
    monkeypatch.setenv("GITHUB_JOB", "train")
    same = derive_idempotency_key(SPEC, None)
    assert same == derive_idempotency_key(dict(reversed(list(SPEC.items()))), None)  # key order is no change
    assert same != derive_idempotency_key({**SPEC, "devices": 2}, None)
    monkeypatch.setenv("GITHUB_RUN_ATTEMPT", "2")  # a re-run of the workflow is a new submission
    assert same != derive_idempotency_key(SPEC, None)


@pytest.mark.parametrize(("value", "redis", "expected"), [("1", False, 1), ("2", True, 2)])
def test_web_workers(monkeypatch, value, redis, expected):
    monkeypatch.setenv("POLYCHIP_WEB_WORKERS", value)
    for name in ("CHANNEL_REDIS_URL", "POLYCHIP_CACHE_URL"):
        if redis:
            monkeypatch.setenv(name, "redis://127.0.0.1:6379/9")
        else:
            monkeypatch.delenv(name, raising=False)
    assert _web_workers() == expected


@pytest.mark.parametrize("value", ["0", "two", "65"])
def test_web_workers_that_cannot_be(monkeypatch, value):
    monkeypatch.setenv("POLYCHIP_WEB_WORKERS", value)
    with pytest.raises(SystemExit, match="POLYCHIP_WEB_WORKERS"):
        _web_workers()


def test_several_web_workers_need_a_shared_redis(monkeypatch):
    monkeypatch.setenv("POLYCHIP_WEB_WORKERS", "3")
    monkeypatch.delenv("CHANNEL_REDIS_URL", raising=False)
    with pytest.raises(SystemExit, match="CHANNEL_REDIS_URL"):
        _web_workers()


def test_help_loads_neither_django_celery_torch_nor_httpx():
    probe = (
        "import sys\n"
        "from controlplane.cli.main import cli\n"
        "try:\n    cli.main(['--help'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('django', 'celery', 'torch', 'httpx', 'rich') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip().splitlines()[-1] == "[]"


ADVICE = {
    "spec": SPEC,
    "summary": ["Would be admitted now, on 1 tpu-v4."],
    **{
        part: {"reasoning": [f"{part} headline.", f"{part} detail."]}
        for part in ("admission", "start", "batch", "checkpoint", "comm", "cost")
    },
}


@pytest.mark.parametrize(
    ("args", "expected_call"),
    [
        (["advise"], ("POST", "/api/v1/jobs/advise", None)),
        (["submit", "--dry-run"], ("POST", "/api/v1/jobs", {"dry_run": "true"})),
    ],
)
def test_advise_and_a_dry_run_print_each_parts_headline_and_submit_nothing(monkeypatch, tmp_path, args, expected_call):
    from click.testing import CliRunner

    from controlplane.cli.api import Api
    from controlplane.cli.main import cli

    calls = []

    def request(self, method, path, *, json=None, params=None, idempotency_key=None, timeout_s=None):
        calls.append((method, path, params, json, idempotency_key))
        return ADVICE

    monkeypatch.setattr(Api, "request", request)
    spec = tmp_path / "job.yaml"
    spec.write_text("name: a\ndevices: 1\nflavors: [tpu-v4]\n")
    target = ["--url", "http://polychip.invalid", "--token", "pc_test"]
    table = CliRunner().invoke(cli, [*args, str(spec), *target], env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    assert [(method, path, params) for method, path, params, _, _ in calls] == [expected_call]
    assert calls[0][3] == SPEC and calls[0][4] is None  # the spec as read, and no key to use up
    assert all(f"{part} headline." in table.stdout for part in ("admission", "cost"))
    assert "detail" not in table.stdout
    as_json = CliRunner().invoke(cli, [*args, str(spec), *target, "-o", "json"])
    assert json.loads(as_json.stdout) == ADVICE
