"""The portal in a real browser: a tenant's user signs in, sees their jobs, and watches them change live."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Locator, Page, expect

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

NEVER_FITS = {
    "devices": 30,
    "flavors": ["a100-sxm"],
    "wait_for_capacity": True,
}  # more than the pool: queued, never starts
WAIT_MS = 10_000


def sign_in(page: Page, username: str, password: str) -> None:
    page.goto("/")
    expect(page).to_have_url(re.compile(r"/login/"))
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    expect(page.locator("header .who")).to_contain_text(username)
    page.wait_for_load_state("load")


def row(page: Page, job_id: int) -> Locator:
    return page.locator(f'#jobs tr[data-job="{job_id}"]')


def test_a_signed_in_user_sees_their_jobs_change_live(
    api_for, tenants, pool, page: Page, page_errors, screenshots, capsys
):
    acme, globex, _ = tenants
    acme_api, globex_api = api_for(acme.token), api_for(globex.token)
    existing = acme_api.post(
        "/api/v1/jobs", {"name": "e2e-existing", **NEVER_FITS, "comm": {"compression": "topk", "density": 0.01}}
    )
    foreign = globex_api.post("/api/v1/jobs", {"name": "globex-secret", **NEVER_FITS})
    assert existing.status_code == foreign.status_code == 201, (existing.text, foreign.text)
    existing_id, foreign_id = existing.json()["id"], foreign.json()["id"]

    try:
        sign_in(page, acme.username, acme.password)
        assert page_errors == [], f"the portal's script failed while loading: {page_errors}"

        # The page lists acme's job, and nothing of globex's is even in its HTML.
        expect(row(page, existing_id)).to_contain_text("e2e-existing", timeout=WAIT_MS)
        expect(row(page, existing_id).get_by_test_id("state")).to_have_text("queued")
        expect(row(page, foreign_id)).to_have_count(0)
        assert "globex-secret" not in page.content()
        expect(page.locator("#live")).to_have_text("live", timeout=WAIT_MS)
        # Its quota is drawn: acme holds nothing yet of its 1000 NAU, and no cohort lends to it.
        expect(page.locator('#quotas tr[data-resource="nau"]')).to_contain_text("0 / 1000 NAU")
        # A job that waits says where it stands in the queue.
        expect(row(page, existing_id)).to_contain_text("#1 in your queue")
        # Its communication policy shows as asked for until rank 0 reports the one that runs.
        expect(row(page, existing_id).get_by_test_id("comm")).to_have_text("comm topk requested")

        # From here on the page must change by itself: a reload or a navigation would lose the marker.
        page.evaluate("window.__marker = 1")
        url = page.url

        created = acme_api.post("/api/v1/jobs", {"name": "e2e-live", **NEVER_FITS})
        assert created.status_code == 201, created.text
        job_id = created.json()["id"]
        expect(row(page, job_id)).to_contain_text("e2e-live", timeout=WAIT_MS)
        expect(row(page, job_id).get_by_test_id("state")).to_have_text("queued", timeout=WAIT_MS)

        cancelled = acme_api.post(f"/api/v1/jobs/{job_id}/cancel")
        assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled", cancelled.text
        expect(row(page, job_id).get_by_test_id("state")).to_have_text("cancelled", timeout=WAIT_MS)

        # A job that starts takes a device and quota: the pool and quota cards follow, without a reload.
        small = {"name": "e2e-small", "devices": 1, "flavors": ["h100-sxm"], "workload": {"steps": 100_000}}
        started = acme_api.post("/api/v1/jobs", small).json()["id"]
        expect(row(page, started).get_by_test_id("state")).to_have_text(re.compile("admitted|running"), timeout=WAIT_MS)
        expect(page.locator('table.pool tr[data-flavor="h100-sxm"] [data-cell="allocated"]')).to_have_text(
            "1", timeout=WAIT_MS
        )
        expect(page.locator('#quotas tr[data-resource="nau"] [data-cell="in-use"]')).not_to_have_text(
            "0 / 1000 NAU", timeout=WAIT_MS
        )
        acme_api.post(f"/api/v1/jobs/{started}/cancel")
        expect(page.locator('table.pool tr[data-flavor="h100-sxm"] [data-cell="allocated"]')).to_have_text(
            "0", timeout=WAIT_MS
        )

        assert page.evaluate("window.__marker") == 1, "the page reloaded"
        assert page.url == url
        expect(row(page, existing_id).get_by_test_id("state")).to_have_text("queued")
        expect(row(page, foreign_id)).to_have_count(0)
        assert page_errors == [], page_errors
    finally:
        # Pass or fail, leave a picture of the page for people to look at.
        shot = screenshots / "portal-live.png"
        page.screenshot(path=str(shot), full_page=True)
        with capsys.disabled():
            print(f"\nscreenshot: {shot}")
