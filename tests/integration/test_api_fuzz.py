"""The API fuzzed against its own OpenAPI schema: schemathesis, every check and every phase, with a
fixed seed, against a live stack (ASGI server, Celery, PostgreSQL, Redis), once with each of two
tenants' tokens. No server error, no answer outside the schema, no route that ignores its auth.

The rate limits are raised for this stack alone: at their defaults most generated requests would be
answered 429 and test nothing. The JUnit report of each run is kept in var/reports/.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.stack import free_port, running_stack, stack_env

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "tests" / "schemathesis.toml"
REPORTS = ROOT / "var" / "reports"
SEED = 1
EXAMPLES = 20


@pytest.fixture(scope="module")
def fuzz_stack(django_db_setup, django_db_blocker, tmp_path_factory) -> Iterator[str]:
    port = free_port()
    env = {
        **stack_env(tmp_path_factory.mktemp("fuzz-var"), port),
        "POLYCHIP_RATE_PER_TOKEN": "1000000/min",
        "POLYCHIP_RATE_PER_ADDRESS": "1000000/min",
    }
    with running_stack(django_db_blocker, env, port) as url:
        yield url


def _fuzz(url: str, token: str, report: Path) -> subprocess.CompletedProcess[str]:
    report.parent.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "--config-file",
        str(CONFIG),
        "--no-color",
        "run",
        f"{url}/api/v1/schema?format=json",
        "--url",
        url,
        "--header",
        f"Authorization: Bearer {token}",
        "--seed",
        str(SEED),
        "--max-examples",
        str(EXAMPLES),
        "--workers",
        "1",  # hypothesis reads lambda sources through ast, which is not safe across threads
        "--report",
        "junit",
        "--report-junit-path",
        str(report),
    ]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.schemathesis_hooks"}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)


@pytest.mark.timeout(1200)
def test_the_api_keeps_its_schema_under_fuzzing_for_two_tenants(fuzz_stack, tenants, pool):
    from tenants import services

    for tenant in tenants[:2]:
        token = services.issue_token(
            tenant_id=tenant.id, username=tenant.username, name="fuzz", scopes=["read", "submit", "manage"]
        ).secret
        report = REPORTS / f"schemathesis-{tenant.slug}.xml"
        done = _fuzz(fuzz_stack, token, report)
        output = done.stdout + done.stderr
        summary = output[output.find("SUMMARY") :] if "SUMMARY" in output else output[-4000:]
        assert done.returncode == 0, f"{tenant.slug}:\n{output[-12000:]}"
        tested = re.search(r"Tested: (\d+)", output)
        assert tested and int(tested.group(1)) >= 40, summary  # every operation was reached
        assert re.search(r"(\d+) generated, \1 passed", output), summary
        assert report.exists() and "<testsuite" in report.read_text()
