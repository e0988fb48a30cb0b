"""Issue 17, item 8: HTTPS hardening can be switched on, and `check --deploy` is clean under the
production profile (POLYCHIP_ENV=production), as documented in the README."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_WARNINGS = ("security.W004", "security.W008", "security.W012", "security.W016")


def check_deploy(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POLYCHIP_", "DJANGO_", "DATABASE_URL"))}
    environ.update(POLYCHIP_VAR_DIR=str(tmp_path), **env)
    command = [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"]
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("profile", [{}, {"POLYCHIP_ENV": "staging"}])
def test_without_the_production_profile_check_deploy_names_what_is_missing(tmp_path, profile):
    result = check_deploy(tmp_path, **profile)
    assert result.returncode != 0
    for warning in DEPLOY_WARNINGS:
        assert warning in result.stderr + result.stdout, warning


def test_the_production_profile_passes_check_deploy(tmp_path):
    result = check_deploy(
        tmp_path,
        POLYCHIP_ENV="production",
        DJANGO_SECRET_KEY="a-production-key-" + "x7Qp2" * 12,
        DJANGO_ALLOWED_HOSTS="polychip.example.com",
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_each_hardening_setting_is_read_from_the_environment(tmp_path):
    probe = (
        "from django.conf import settings as s; "
        "print(s.SECURE_SSL_REDIRECT, s.SECURE_HSTS_SECONDS, s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, "
        "getattr(s, 'SECURE_PROXY_SSL_HEADER', None), s.CSRF_TRUSTED_ORIGINS)"
    )
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POLYCHIP_", "DJANGO_"))}
    environ.update(
        POLYCHIP_VAR_DIR=str(tmp_path),
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        POLYCHIP_ENV="production",
        POLYCHIP_HSTS_SECONDS="600",
        POLYCHIP_BEHIND_TLS_PROXY="1",
        POLYCHIP_TRUSTED_ORIGINS="https://polychip.example.com",
    )
    out = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); " + probe],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == (
        "True 600 True True ('HTTP_X_FORWARDED_PROTO', 'https') ['https://polychip.example.com']"
    )
