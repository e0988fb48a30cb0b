"""The e2e tier drives the portal in a real browser (Debian's Chromium through Playwright) against the stack."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.stack import ROOT, api_for, stack, stack_var  # noqa: F401  (fixtures shared with the integration tier)

CHROMIUM = Path("/usr/bin/chromium")
# axe-core from npm (package.json; `make install` runs npm ci): the accessibility checks of every page.
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture(scope="session", autouse=True)
def _require_services() -> None:
    from django.conf import settings

    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        pytest.fail("the e2e tier runs on PostgreSQL: set DATABASE_URL (make test does)")
    if not settings.CELERY_BROKER_URL.startswith("redis"):
        pytest.fail("the e2e tier runs Celery on Redis: set CELERY_BROKER_URL (make test does)")
    if not CHROMIUM.is_file():
        pytest.fail(f"the e2e tier drives Debian's Chromium at {CHROMIUM}: apt-get install chromium")
    if not AXE.is_file():
        pytest.fail(f"the e2e tier checks accessibility with axe-core from npm at {AXE}: run `make install` (npm ci)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.fail("the e2e tier needs Playwright for Python: pip install -e '.[dev]' (never `playwright install`)")
    # Drop messages that an interrupted earlier run left behind.
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


@pytest.fixture
def page_errors() -> list[str]:
    """What the page under test reported: uncaught exceptions and console errors (a test asserts it is empty)."""
    return []


@pytest.fixture
def page(stack: str, page_errors: list[str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:  # noqa: F811
    """A fresh page in a fresh headless Chromium, with relative URLs going to the stack."""
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop running in this thread, which makes Django refuse ORM calls
    # (SynchronousOnlyOperation) from fixtures set up or torn down while the browser is open. Nothing async
    # runs Django code here, so the check is a false alarm; the variable is restored after the test.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(base_url=stack, viewport={"width": 1280, "height": 800})
            page = context.new_page()
            page.on("pageerror", lambda error: page_errors.append(f"{error.name}: {error.message}"))
            page.on("console", lambda msg: _console_error(msg, page_errors))
            yield page
        finally:
            browser.close()


def _console_error(msg: Any, errors: list[str]) -> None:
    url = msg.location.get("url", "")
    # The browser asks for /favicon.ico on its own; the portal serves none, and that breaks nothing.
    if msg.type == "error" and not url.endswith("/favicon.ico"):
        errors.append(f"console: {msg.text} ({url})")


@pytest.fixture
def screenshots() -> Path:
    """The folder where tests leave screenshots for people to look at (var/ is gitignored)."""
    folder = ROOT / "var" / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def axe_violations(page: Any, impacts: tuple[str, ...] = ("serious", "critical")) -> list[str]:
    """axe-core's violations of ``impacts`` on the page as it stands, one line each (rule, impact, where).

    Run through Playwright's evaluate, which the page's Content-Security-Policy does not govern, so the
    page is checked exactly as served."""
    page.evaluate(AXE.read_text())
    found = page.evaluate("async () => (await axe.run(document, {resultTypes: ['violations']})).violations")
    return [
        f"{v['id']} ({v['impact']}): {v['help']} at {', '.join(str(n['target']) for n in v['nodes'][:3])}"
        for v in found
        if v["impact"] in impacts
    ]
