"""Issue 17, item 1: no known account on any stack.

`polychip up` creates no user; `polychip demo` makes the demo tenant's owner and an operator with
random passwords written 0600 to the var folder, both marked as demo accounts; a production-like
start (POLYCHIP_ENV=production, or DEBUG off with DATABASE_URL set) refuses to run while one exists.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import connection

from controlplane.production import refuse_demo_accounts
from controlplane.settings import production_like
from tenants import services

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def _demo_accounts(tmp_path: Path) -> tuple[Path, Path]:
    password_file, token_file = tmp_path / "demo-password", tmp_path / "demo-token"
    call_command(
        "ensure_tenant",
        *("--user", "demo", "--demo", "--password-file", str(password_file), "--token-file", str(token_file)),
        stdout=open(os.devnull, "w"),  # noqa: SIM115
    )
    return password_file, token_file


def test_the_demo_password_is_random_private_and_the_one_that_signs_in(tmp_path):
    password_file, token_file = _demo_accounts(tmp_path)
    first = password_file.read_text().strip()
    assert len(first) >= 16 and first != "demo-password"
    for path in (password_file, token_file):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert authenticate(username="demo", password=first) is not None
    assert authenticate(username="demo", password="demo-password") is None

    # Run again (a second `polychip demo`): a new password, and the file holds the one that works.
    _demo_accounts(tmp_path)
    second = password_file.read_text().strip()
    assert second != first
    assert authenticate(username="demo", password=second) is not None
    assert services.demo_usernames() == ["demo"]


def test_there_is_no_default_password_to_fall_back_on(tmp_path):
    with pytest.raises(Exception, match="password-file"):
        call_command("ensure_tenant", "--user", "demo", "--token-file", str(tmp_path / "t"))


def test_the_demo_operator_is_a_demo_account(tmp_path):
    call_command(
        "ensure_operator",
        "--demo",
        "--password-file",
        str(tmp_path / "op"),
        stdout=open(os.devnull, "w"),  # noqa: SIM115
    )
    assert services.demo_usernames() == ["operator"]
    assert stat.S_IMODE((tmp_path / "op").stat().st_mode) == 0o600


@pytest.mark.parametrize(
    ("environ", "debug", "expected"),
    [
        ({}, False, False),  # the embedded default: SQLite, no DATABASE_URL
        ({"DATABASE_URL": "postgres://db/polychip"}, False, True),
        ({"DATABASE_URL": "postgres://db/polychip"}, True, False),  # a developer's database, debugging on
        ({"DATABASE_URL": "  "}, False, False),
        ({"POLYCHIP_ENV": "production"}, True, True),  # said outright
        ({"POLYCHIP_ENV": " Production "}, False, True),
        ({"POLYCHIP_ENV": "staging"}, True, False),
    ],
)
def test_what_counts_as_production_like(environ, debug, expected):
    assert production_like(environ, debug) is expected


def test_a_production_like_start_refuses_while_a_demo_account_exists(tmp_path, settings):
    settings.PRODUCTION_LIKE = True
    refuse_demo_accounts()  # no demo account: starts
    _demo_accounts(tmp_path)
    with pytest.raises(ImproperlyConfigured, match="demo accounts exist: demo"):
        refuse_demo_accounts()
    settings.PRODUCTION_LIKE = False
    refuse_demo_accounts()  # the embedded default may keep its demo

    # The Celery worker and beat stop, rather than log the refusal and serve on.
    from controlplane.celery import _refuse_demo_accounts

    settings.PRODUCTION_LIKE = True
    with pytest.raises(SystemExit, match="demo accounts exist: demo"):
        _refuse_demo_accounts()
    get_user_model().objects.filter(username="demo").delete()
    refuse_demo_accounts()


@pytest.mark.django_db(transaction=True)
def test_the_asgi_server_will_not_load_in_production_with_a_demo_account(tmp_path):
    _demo_accounts(tmp_path)
    db = connection.settings_dict
    env = dict(
        os.environ,
        POLYCHIP_ENV="production",
        DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        POLYCHIP_VAR_DIR=str(tmp_path / "var"),
    )
    probe = [sys.executable, "-c", "import controlplane.asgi"]
    refused = subprocess.run(probe, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "refusing to start a production-like Polychip while demo accounts exist: demo" in refused.stderr

    get_user_model().objects.filter(username="demo").delete()
    started = subprocess.run(probe, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert started.returncode == 0, started.stderr[-2000:]


def test_the_demo_token_stays_the_same_across_starts_until_it_is_revoked(tmp_path):
    _, token_file = _demo_accounts(tmp_path)
    first = token_file.read_text().strip()
    _demo_accounts(tmp_path)  # a second `make up`: a CI secret made from the first still works
    assert token_file.read_text().strip() == first
    assert services.authenticate_token(first) is not None
    token = services.authenticate_token(first)
    services.revoke_token(tenant_id=token.tenant_id, token_id=token.pk)
    _demo_accounts(tmp_path)  # revoked: a new one replaces it
    assert token_file.read_text().strip() != first
    assert services.authenticate_token(token_file.read_text().strip()) is not None
