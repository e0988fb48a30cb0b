"""The real `polychip` command against a live stack: exit codes, stdout that parses, and one line (never a
traceback) for everything that goes wrong; and the CI examples in docs/ci, run as written."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from jobs.models import JobState, TrainingJob
from tests.integration.test_bundles_api import tar_gz
from tests.stack import ROOT, free_port

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

QUICK = {"name": "cli-quick", "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 20, "global_batch": 32}}
LONG = {"name": "cli-long", "devices": 1, "flavors": ["tpu-v4"], "workload": {"steps": 100_000, "global_batch": 32}}
BIN = Path(sys.executable).parent


def polychip(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300):
    done = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", *args],
        env=env,
        cwd=cwd or ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert "Traceback" not in done.stderr + done.stdout, done.stderr
    return done


@pytest.fixture
def client_env(stack, tenants, pool, tmp_path) -> dict[str, str]:
    """A CI runner's environment: the stack's URL, the first tenant's token, its own config folder."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POLYCHIP_", "GITHUB_", "CI_"))}
    return {
        **env,
        "POLYCHIP_URL": stack,
        "POLYCHIP_TOKEN": tenants[0].token,
        "POLYCHIP_CONFIG": str(tmp_path / "config" / "polychip.json"),
        "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        "NO_COLOR": "1",
    }


def spec_file(tmp_path: Path, spec: dict, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def one_line(done) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("polychip: ")
    return lines[0]


def test_what_goes_wrong_is_one_line_and_an_exit_code(client_env, tmp_path):
    refused = polychip("list", env={**client_env, "POLYCHIP_URL": f"http://127.0.0.1:{free_port()}"})
    assert refused.returncode == 1 and "cannot reach Polychip" in one_line(refused)
    bad_token = polychip("list", env={**client_env, "POLYCHIP_TOKEN": "pc_not-a-token"})
    assert bad_token.returncode == 1 and "polychip login" in one_line(bad_token)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\ndevices: [1\nflavors: a\n")
    bad_yaml = polychip("submit", str(broken), env=client_env)
    assert bad_yaml.returncode == 2 and "not valid YAML or JSON at line" in one_line(bad_yaml)
    missing = polychip("submit", str(tmp_path / "nope.yaml"), env=client_env)
    assert missing.returncode == 2 and "no such file" in one_line(missing)
    unknown = polychip("get", "999999", env=client_env)
    assert unknown.returncode == 102 and "not found" in one_line(unknown)
    not_an_id = polychip("wait", "twelve", env=client_env)
    assert not_an_id.returncode == 2
    invalid = polychip("submit", str(spec_file(tmp_path, {**QUICK, "prioirty": 1, "devices": 0})), env=client_env)
    assert invalid.returncode == 2 and "2 problems" in one_line(invalid) and "did you mean 'priority'" in invalid.stderr
    never = polychip("submit", str(spec_file(tmp_path, {**QUICK, "devices": 5})), env=client_env)
    assert never.returncode == 104 and "pool has 4" in one_line(never)
    no_option = polychip("list", "--bogus", env=client_env)
    assert no_option.returncode == 2 and "No such option" in no_option.stderr
    assert not TrainingJob.objects.exists()


def test_submit_and_wait_exit_with_the_jobs_outcome_and_stdout_is_json(client_env, tmp_path):
    done = polychip(
        "submit", str(spec_file(tmp_path, QUICK)), "--wait", "--timeout", "240", "-o", "json", env=client_env
    )
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["state"] == "succeeded" and job["progress"]["steps_done"] == 20
    assert f"submitted job {job['id']}" in done.stderr
    # Waiting again on an ended job answers at once, with its outcome.
    again = polychip("wait", f"job/{job['id']}", "-o", "name", env=client_env)
    assert (again.returncode, again.stdout) == (0, f"job/{job['id']}\n")
    listed = polychip("list", "--state", "succeeded", "-o", "json", env=client_env)
    assert [row["id"] for row in json.loads(listed.stdout)] == [job["id"]]
    shown = polychip("logs", str(job["id"]), "--rank", "0", env=client_env)
    assert shown.returncode == 0 and shown.stdout.strip()
    assert (
        json.loads(polychip("events", str(job["id"]), "-o", "json", env=client_env).stdout)[0]["to_state"] == "queued"
    )


def test_a_wait_that_runs_out_of_time_exits_101_and_may_cancel(client_env, tmp_path):
    spec = str(spec_file(tmp_path, LONG))
    waited = polychip("submit", spec, "--wait", "--timeout", "2", "-o", "json", env=client_env)
    assert waited.returncode == 101, waited.stderr
    job = json.loads(waited.stdout)
    assert job["state"] in ("queued", "admitted", "running") and "polychip wait" in waited.stderr
    cancelled = polychip("wait", str(job["id"]), "--timeout", "1", "--cancel-on-timeout", "-o", "json", env=client_env)
    assert cancelled.returncode == 101 and json.loads(cancelled.stdout)["state"] == "cancelled"
    assert polychip("wait", str(job["id"]), env=client_env).returncode == 103
    retried = polychip("retry", str(job["id"]), "-o", "json", env=client_env)
    clone = json.loads(retried.stdout)
    assert clone["id"] != job["id"] and clone["spec"] == job["spec"]
    assert polychip("cancel", str(clone["id"]), "-q", env=client_env).returncode == 0
    assert TrainingJob.objects.get(pk=clone["id"]).state == JobState.CANCELLED


def test_a_job_that_fails_exits_100(client_env, tmp_path, tenants):
    import httpx

    bundle = httpx.post(
        f"{client_env['POLYCHIP_URL']}/api/v1/bundles",
        content=tar_gz({"train.py": b"raise SystemExit('the data is not there')\n"}),
        headers={"Authorization": f"Bearer {tenants[0].token}", "Content-Type": "application/gzip"},
    ).json()["bundle"]
    spec = {
        "name": "cli-fails",
        "devices": 1,
        "flavors": ["tpu-v4"],
        "max_restarts": 0,
        "workload": {"kind": "python", "bundle": bundle, "entrypoint": "train.py", "steps": 5},
    }
    done = polychip(
        "submit", str(spec_file(tmp_path, spec)), "--wait", "--timeout", "240", "-o", "json", env=client_env
    )
    assert done.returncode == 100, done.stderr
    assert json.loads(done.stdout)["state"] == "failed"


def test_a_retried_ci_step_submits_once(client_env, tmp_path):
    spec = str(spec_file(tmp_path, LONG))
    ci = {**client_env, "GITHUB_RUN_ID": "4242", "GITHUB_RUN_ATTEMPT": "1", "GITHUB_JOB": "train"}
    first = json.loads(polychip("submit", spec, "-o", "json", env=ci).stdout)
    second = json.loads(polychip("submit", spec, "-o", "json", env=ci).stdout)
    assert second["id"] == first["id"]
    # Another run is another submission; so is a key given by hand.
    other = json.loads(polychip("submit", spec, "-o", "json", env={**ci, "GITHUB_RUN_ID": "4243"}).stdout)
    keyed = json.loads(polychip("submit", spec, "--idempotency-key", "k-1", "-o", "json", env=client_env).stdout)
    again = json.loads(polychip("submit", spec, "--idempotency-key", "k-1", "-o", "json", env=client_env).stdout)
    assert len({first["id"], other["id"], keyed["id"]}) == 3 and again["id"] == keyed["id"]
    for job_id in (first["id"], other["id"], keyed["id"]):
        polychip("cancel", str(job_id), "-q", env=client_env)


def test_login_keeps_the_token_private_and_whoami_uses_it(client_env, tenants):
    env = {k: v for k, v in client_env.items() if k != "POLYCHIP_TOKEN"}
    env.pop("POLYCHIP_URL")
    logged = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "login", "--url", client_env["POLYCHIP_URL"]],
        input=tenants[0].token + "\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert logged.returncode == 0, logged.stderr
    config = Path(env["POLYCHIP_CONFIG"])
    assert stat.S_IMODE(config.stat().st_mode) == 0o600
    assert stat.S_IMODE(config.parent.stat().st_mode) == 0o700
    me = json.loads(polychip("whoami", "-o", "json", env=env).stdout)
    assert me["tenant"]["slug"] == "acme"
    wrong = subprocess.run(
        [sys.executable, "-m", "controlplane.cli", "login", "--url", client_env["POLYCHIP_URL"], "--token", "pc_nope"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert wrong.returncode == 1 and json.loads(config.read_text())["token"] == tenants[0].token


def test_the_tenants_picture_and_the_shell_completion(client_env):
    for command in ("queue", "quota", "pool", "usage", "invoices"):
        done = polychip(command, "-o", "json", env=client_env)
        assert done.returncode == 0, (command, done.stderr)
        json.loads(done.stdout)
    table = polychip("pool", env=client_env)
    assert "tpu-v4" in table.stdout and "FLAVOR" in table.stdout
    script = polychip("completion", "bash", env=client_env)
    assert script.returncode == 0 and "_POLYCHIP_COMPLETE" in script.stdout


def _ci_commands(path: Path) -> list[str]:
    """The shell lines of a CI file that call polychip (installing it is this checkout's business)."""
    document = yaml.safe_load(path.read_text())
    scripts: list[str] = []
    if "jobs" in document:  # GitHub Actions
        for job in document["jobs"].values():
            scripts += [step["run"] for step in job["steps"] if "run" in step]
    else:  # GitLab CI
        for job in document.values():
            if isinstance(job, dict):
                scripts += [*job.get("script", []), *job.get("after_script", [])]
    lines = [line.strip() for script in scripts for line in script.splitlines()]
    return [line for line in lines if line.startswith("polychip ") or ("$(" in line and "polychip" in line)]


@pytest.mark.parametrize("example", ["github-actions.yml", "gitlab-ci.yml"])
def test_the_ci_examples_run_as_written(client_env, tmp_path, example):
    commands = _ci_commands(ROOT / "docs" / "ci" / example)
    assert any(re.match(r"polychip submit .*--wait", c) for c in commands), commands
    (tmp_path / "train.yaml").write_text((ROOT / "docs" / "ci" / "train.yaml").read_text())
    ci = {**client_env, "CI_PIPELINE_ID": "77", "CI_JOB_NAME": "train"}
    for command in commands:
        done = subprocess.run(
            ["bash", "-ec", command], cwd=tmp_path, env=ci, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (command, done.stderr)
        assert "Traceback" not in done.stderr
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["state"] == "succeeded"
    assert (tmp_path / "train.log").read_text().strip()
