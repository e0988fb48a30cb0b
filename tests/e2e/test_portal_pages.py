"""The portal's pages and the operator console, driven through the UI only in Debian's Chromium: own code
uploaded and submitted from the browser and watched to the end (chart points, streamed logs, a checkpoint
download, the cost), every spec error shown inline with nothing submitted, a waiting job's reason and
place, a token issued and revoked, an operator's drain watched as the job moves; axe-core on every page,
and a screenshot of each at 1280 and 390 px."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.conftest import axe_violations
from tests.e2e.test_portal_live import NEVER_FITS, sign_in
from tests.usercode import SDK_EXAMPLE, make_bundle

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

WAIT_MS = 15_000
RUN_MS = 240_000  # a job's whole life on a loaded two-core host
WIDTHS = {"wide": (1280, 900), "narrow": (390, 844)}


def sign_out(page: Page) -> None:
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(re.compile(r"/login/"))


def shoot(page: Page, folder: Path, name: str) -> None:
    """The page at both widths, full length, for people to look at; at 390 px nothing may overflow."""
    for width_name, (width, height) in WIDTHS.items():
        page.set_viewport_size({"width": width, "height": height})
        page.screenshot(path=str(folder / f"{name}-{width_name}.png"), full_page=True)
        if width_name == "narrow":
            overflow = page.evaluate("document.documentElement.scrollWidth - document.documentElement.clientWidth")
            assert overflow <= 1, f"{name} is {overflow} px wider than a 390 px screen"
    page.set_viewport_size({"width": 1280, "height": 900})


def accessible(page: Page, name: str) -> None:
    violations = axe_violations(page)
    assert violations == [], f"{name}: {violations}"


def test_own_code_from_the_browser_to_a_finished_job_and_only_its_tenant_sees_it(
    tenants, pool, page: Page, page_errors, screenshots, tmp_path
):
    acme, globex, _ = tenants
    bundle, _ = make_bundle(tmp_path / "bundle", {"train.py": SDK_EXAMPLE.read_text()})
    sign_in(page, acme.username, acme.password)
    page.get_by_role("link", name="Submit", exact=True).click()
    expect(page).to_have_url(re.compile(r"/submit/$"))

    page.fill("#f-name", "browser-own-code")
    page.fill("#f-devices", "1")
    page.fill("#f-steps", "40")
    for box in page.locator('input[name="flavors"]').all():
        box.set_checked(box.get_attribute("value") == "h100-sxm")
    page.select_option("#f-kind", "python")
    page.set_input_files("#f-bundle", str(bundle))
    expect(page.locator("#bundle-status")).to_contain_text("uploaded code.tar.gz", timeout=WAIT_MS)
    page.fill("#f-entrypoint", "train.py")
    # What the form does not offer is written in the editor: checkpoints every 10 steps.
    expect(page.locator("#editor")).to_have_value(re.compile('entrypoint: "train.py"'))
    page.fill("#editor", page.input_value("#editor") + "checkpoint: {weights_every: 10, optimizer_every: 10}\n")
    # The server's own check, before submit: it would start now, on which flavor, at what price.
    expect(page.get_by_test_id("preview")).to_contain_text("Would start now on 1\u00d7 h100-sxm", timeout=WAIT_MS)
    expect(page.get_by_test_id("preview")).to_contain_text("an hour at your prices")
    accessible(page, "submit")
    shoot(page, screenshots, "submit")
    page.get_by_role("button", name="Submit", exact=True).click()

    expect(page).to_have_url(re.compile(r"/jobs/\d+$"), timeout=WAIT_MS)
    job_id = int(page.url.rsplit("/", 1)[1])
    expect(page.get_by_test_id("state")).to_have_text("succeeded", timeout=RUN_MS)
    # Chart points, streamed log lines, a checkpoint to download, the cost so far.
    expect(page.locator("#chart-loss")).not_to_have_attribute("data-points", "0", timeout=WAIT_MS)
    expect(page.locator("#chart-speed")).not_to_have_attribute("data-points", "0", timeout=WAIT_MS)
    expect(page.locator("#logs .line").first).to_be_visible(timeout=WAIT_MS)
    page.fill("#log-search", "loss")
    expect(page.locator("#logs mark").first).to_be_visible()
    expect(page.get_by_test_id("cost-total")).to_contain_text("USD", timeout=WAIT_MS)
    expect(page.get_by_test_id("model")).to_be_visible(timeout=WAIT_MS)
    link = page.locator("#checkpoints tr[data-step] a[download]").first
    expect(link).to_be_visible(timeout=WAIT_MS)
    with page.expect_download() as download:
        link.click()
    assert download.value.suggested_filename.endswith(".tar"), download.value.suggested_filename
    assert Path(download.value.path()).stat().st_size > 0
    expect(page.locator("#timeline li[data-kind=transition]").last).to_contain_text("succeeded")
    accessible(page, "job")
    shoot(page, screenshots, "job")

    # The list links to it; then another tenant sees none of it, not even by its address.
    page.goto("/")
    expect(page.locator(f'#jobs tr[data-job="{job_id}"] a')).to_have_attribute("href", f"/jobs/{job_id}")
    # The quota card charts the last day's use: the job's NAU is in it.
    expect(page.locator("#chart-quota")).to_have_attribute("data-points", "96", timeout=WAIT_MS)
    assert float(page.get_attribute("#chart-quota", "data-peak") or "0") > 0
    accessible(page, "jobs")
    shoot(page, screenshots, "jobs")

    # Its cost is on the month's chart (a bar a day, today's among them) and its held time in the idle table.
    page.get_by_role("link", name="Billing").click()
    today = datetime.now(UTC).date()
    expect(page.locator("#chart-spend")).to_have_attribute("data-points", str(today.day), timeout=WAIT_MS)
    assert page.locator(f'#spend-days tr[data-day="{today.isoformat()}"] td.num').text_content() != "0.00"
    idle = page.locator('#idle tr[data-flavor="h100-sxm"]')
    expect(idle).to_be_visible()
    held, idle_s = (float(idle.get_attribute(f"data-{what}-s") or "") for what in ("held", "idle"))
    assert 0 < idle_s < held, (held, idle_s)  # starting the run was idle; its steps were not
    accessible(page, "billing-with-usage")
    shoot(page, screenshots, "billing-with-usage")
    sign_out(page)
    sign_in(page, globex.username, globex.password)
    response = page.goto(f"/jobs/{job_id}")
    assert response is not None and response.status == 404
    page_errors.remove(next(e for e in page_errors if f"/jobs/{job_id}" in e))  # that 404, logged by the browser
    assert "browser-own-code" not in page.content()
    page.goto("/")
    assert "browser-own-code" not in page.content()
    assert page_errors == [], page_errors


def test_an_invalid_spec_shows_every_error_inline_and_submits_nothing(tenants, pool, page: Page, page_errors):
    from jobs.models import TrainingJob

    acme = tenants[0]
    sign_in(page, acme.username, acme.password)
    page.goto("/submit/")
    page.fill("#editor", "name: ''\ndevices: 0\nflavors: [no-such-chip]\nprioirty: 3\n")
    errors = page.locator("#errors li")
    expect(errors).to_have_count(4, timeout=WAIT_MS)
    fields = sorted(errors.nth(i).get_attribute("data-field") or "" for i in range(4))
    assert fields == ["devices", "flavors[0]", "name", "prioirty"], fields
    expect(page.locator('#errors li[data-field="prioirty"]')).to_contain_text("did you mean 'priority'")
    expect(page.get_by_role("button", name="Submit", exact=True)).to_be_disabled()
    expect(page.locator("#editor")).to_have_attribute("aria-invalid", "true")
    # Broken YAML names its line.
    page.fill("#editor", "name: [\n")
    expect(page.locator("#errors")).to_contain_text("YAML at line 2", timeout=WAIT_MS)
    assert TrainingJob.objects.filter(tenant_id=acme.id).count() == 0
    # The browser logs each refused check as a failed load; those 400s are the point here, nothing else is.
    refused = "the server responded with a status of 400"
    assert [e for e in page_errors if not (refused in e and "/api/v1/jobs/preview" in e)] == [], page_errors


def test_a_waiting_job_says_why_and_where_and_the_tenant_can_change_its_priority(
    api_for, tenants, pool, page: Page, page_errors, screenshots
):
    acme = tenants[0]
    job = api_for(acme.token).post("/api/v1/jobs", {"name": "waits", **NEVER_FITS}).json()
    sign_in(page, acme.username, acme.password)
    page.goto(f"/jobs/{job['id']}")
    expect(page.get_by_test_id("state")).to_have_text("queued")
    expect(page.locator("#reason")).to_contain_text("#1 in your queue", timeout=WAIT_MS)
    # What would let it start: it asks for more a100s than the pool has in service.
    expect(page.locator('#outlook li[data-flavor="a100-sxm"]')).to_contain_text("more than the 2 in service")
    accessible(page, "a waiting job")
    shoot(page, screenshots, "job-waiting")
    page.fill("#priority", "5")
    page.get_by_role("button", name="Set priority").click()
    expect(page.locator("#announce")).to_have_text("priority set to 5", timeout=WAIT_MS)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Cancel").click()
    expect(page.get_by_test_id("state")).to_have_text("cancelled", timeout=WAIT_MS)
    accessible(page, "a cancelled job")  # its state badge's contrast too
    expect(page.get_by_role("button", name="Clone and resubmit")).to_be_enabled()
    page.get_by_role("button", name="Clone and resubmit").click()
    expect(page).not_to_have_url(re.compile(rf"/jobs/{job['id']}$"), timeout=WAIT_MS)
    expect(page.get_by_test_id("state")).to_have_text("queued", timeout=WAIT_MS)
    page.goto("/")
    expect(page.locator(f'#jobs tr[data-job="{job["id"]}"]')).to_contain_text("cancelled", timeout=WAIT_MS)
    accessible(page, "jobs, one cancelled and one waiting")
    assert page_errors == [], page_errors


def test_a_tenant_admin_issues_a_token_sees_it_once_and_revokes_it(
    api_for, tenants, pool, page: Page, page_errors, screenshots
):
    acme = tenants[0]
    sign_in(page, acme.username, acme.password)
    page.get_by_role("link", name="Tokens").click()
    page.fill("#t-name", "ci-from-the-browser")
    page.get_by_role("button", name="Issue token").click()
    secret = page.get_by_test_id("secret")
    expect(secret).to_contain_text("pc_", timeout=WAIT_MS)
    token = secret.inner_text().strip()
    assert api_for(token).get("/api/v1/me").status_code == 200
    row = page.locator("#tokens tr", has_text="ci-from-the-browser")
    expect(row.get_by_test_id("token-state")).to_have_text("active")
    accessible(page, "tokens")
    shoot(page, screenshots, "tokens")
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name=re.compile("Revoke")).click()
    expect(row.get_by_test_id("token-state")).to_have_text("revoked", timeout=WAIT_MS)
    assert api_for(token).get("/api/v1/me").status_code == 401
    # Budgets: a soft budget above the hard one is refused, naming the field; a valid pair is saved.
    page.fill("#b-soft", "500")
    page.fill("#b-hard", "100")
    page.get_by_role("button", name="Save budgets").click()
    expect(page.locator("#budget-errors li")).to_contain_text("soft_budget", timeout=WAIT_MS)
    page_errors.remove(next(e for e in page_errors if "/api/v1/billing/budget" in e))  # that refusal's 400
    page.fill("#b-hard", "900")
    page.get_by_role("button", name="Save budgets").click()
    expect(page.locator("#budget-status")).to_contain_text("Saved", timeout=WAIT_MS)
    page.goto("/billing/")
    accessible(page, "billing")
    shoot(page, screenshots, "billing")
    assert page_errors == [], page_errors


@pytest.mark.timeout(600)
def test_an_operator_drains_a_node_and_watches_the_job_move_and_resume(
    api_for, tenants, pool, page: Page, page_errors, screenshots
):
    from django.contrib.auth import get_user_model

    acme = tenants[0]
    get_user_model().objects.create_user("operator", password="operator-password-1", is_staff=True)
    api = api_for(acme.token)
    spec = {
        "name": "moves",
        "devices": 1,
        "flavors": ["h100-sxm", "a100-sxm"],
        "workload": {"kind": "builtin", "model": "synthetic-mlp", "steps": 3000},
        "checkpoint": {"weights_every": 20, "optimizer_every": 20},
    }
    job_id = api.post("/api/v1/jobs", spec).json()["id"]
    api.wait_for(job_id, {"running"}, timeout_s=180)
    waiting = api.post("/api/v1/jobs", {"name": "waits-for-tpus", **NEVER_FITS}).json()["id"]

    sign_in(page, "operator", "operator-password-1")
    # An operator who belongs to no tenant lands on the console.
    expect(page).to_have_url(re.compile(r"/console/$"))
    holder = page.locator(f'.node:has([data-testid=holder][data-job="{job_id}"])')
    expect(holder).to_have_count(1, timeout=WAIT_MS)
    first_node = holder.get_attribute("data-node")
    # Utilization over the day, per flavor: the running job's flavor has held devices in it.
    held = page.locator("#utilization figure[data-held]")
    expect(held.first).to_be_visible(timeout=WAIT_MS)
    assert any(float(f.get_attribute("data-held") or "0") > 0 for f in held.all())
    accessible(page, "console-cluster")
    shoot(page, screenshots, "console-cluster")
    page.once("dialog", lambda dialog: dialog.accept())
    holder.get_by_role("button", name=f"Drain node {first_node}").click()
    expect(page.locator("#announce")).to_contain_text(f"#{job_id}", timeout=WAIT_MS)
    # The node's devices are cordoned, and the job comes back running on another node.
    drained = page.locator(f'.node[data-node="{first_node}"] .cell')
    expect(drained.first).to_have_attribute("data-health", "cordoned", timeout=WAIT_MS)
    moved = page.locator(f'.node:not([data-node="{first_node}"]):has([data-testid=holder][data-job="{job_id}"])')
    expect(moved).to_have_count(1, timeout=RUN_MS)
    job = api.wait_for(job_id, {"running"}, timeout_s=120)
    assert job["restarts"] == 0 and job["attempt"] == 1, job  # a move, not a failure
    # Return the node to service from the map.
    page.locator(f'.node[data-node="{first_node}"] .cell details summary').first.click()
    page.locator(f'.node[data-node="{first_node}"] .cell').first.get_by_role(
        "button", name=re.compile("Return to service")
    ).click()
    expect(page.locator("#announce")).to_contain_text("is now healthy", timeout=WAIT_MS)
    expect(drained.first).to_have_attribute("data-health", "healthy", timeout=WAIT_MS)
    # Both changes are in the device's health history, newest first, with who made them.
    returned = drained.first.get_attribute("data-device")
    history = page.locator(f'#device-events tr[data-device="{returned}"]')
    expect(history).to_have_count(2, timeout=WAIT_MS)
    expect(history.nth(0)).to_contain_text("cordoned → healthy")
    expect(history.nth(0)).to_contain_text("operator")
    expect(history.nth(1)).to_contain_text("healthy → cordoned")
    expect(history.nth(1)).to_contain_text(f"node {first_node} drained by operator")

    page.get_by_role("link", name="Queue").click()
    expect(page.locator(f'#queue tr[data-job="{waiting}"]')).to_contain_text("acme", timeout=WAIT_MS)
    expect(page.locator('#cohorts tr[data-tenant="acme"][data-resource="nau"]')).to_be_visible()
    accessible(page, "console-queue")
    shoot(page, screenshots, "console-queue")
    api.post(f"/api/v1/jobs/{job_id}/cancel")
    assert page_errors == [], page_errors


def test_an_operator_edits_tenants_cohorts_and_quotas_with_the_apis_validation(
    tenants, pool, page: Page, page_errors, screenshots
):
    from django.contrib.auth import get_user_model

    from tenants import services

    get_user_model().objects.create_user("operator", password="operator-password-1", is_staff=True)
    sign_in(page, "operator", "operator-password-1")
    page.get_by_role("link", name="Tenants").click()
    expect(page).to_have_url(re.compile(r"/console/tenants/$"))
    expect(page.locator('#tenants tr[data-tenant="acme"]')).to_contain_text("nau", timeout=WAIT_MS)

    # A cohort, then a tenant in it; the editor opens on the new tenant.
    page.fill("#c-name", "research")
    page.get_by_role("button", name="Create cohort").click()
    expect(page.locator('#cohort-list tr[data-cohort="research"]')).to_be_visible(timeout=WAIT_MS)
    page.fill("#n-slug", "labs")
    page.fill("#n-name", "Research Labs")
    page.select_option("#n-cohort", label="research")
    page.get_by_role("button", name="Create tenant").click()
    expect(page.locator("#editor-title")).to_have_text("Tenant labs", timeout=WAIT_MS)

    # A quota the API refuses: the error names the field, the input is marked, nothing is stored.
    page.get_by_role("button", name="Add a quota").click()
    page.get_by_label("Resource of quota 1").fill("nau")
    page.get_by_label("Nominal of quota 1").fill("-4")
    page.get_by_role("button", name="Save quotas").click()
    expect(page.locator("#quota-errors")).to_contain_text("quotas[0].nominal", timeout=WAIT_MS)
    expect(page.get_by_label("Nominal of quota 1")).to_have_attribute("aria-invalid", "true")
    labs = next(t for t in services.list_tenants() if t.slug == "labs")
    assert labs.quotas == () and labs.cohort == "research"

    page.get_by_label("Nominal of quota 1").fill("6")
    page.get_by_label("Lending limit of quota 1").fill("2")
    page.get_by_role("button", name="Save quotas").click()
    expect(page.locator('#tenants tr[data-tenant="labs"]')).to_contain_text("nau 6", timeout=WAIT_MS)
    labs = next(t for t in services.list_tenants() if t.slug == "labs")
    assert [(q.resource, q.nominal, q.lending_limit) for q in labs.quotas] == [("nau", 6, 2)]

    # A tenant's own settings: a weight that is no number is refused by name, a good one is kept.
    page.fill("#e-weight", "heavy")
    page.get_by_role("button", name="Save tenant").click()
    expect(page.locator("#tenant-errors")).to_contain_text("fair_share_weight", timeout=WAIT_MS)
    page.fill("#e-weight", "2.5")
    page.fill("#e-max-queued", "40")
    page.get_by_role("button", name="Save tenant").click()
    expect(page.locator('#tenants tr[data-tenant="labs"]')).to_contain_text("2.5", timeout=WAIT_MS)
    labs = next(t for t in services.list_tenants() if t.slug == "labs")
    assert (labs.fair_share_weight, labs.max_queued_jobs) == (2.5, 40)
    accessible(page, "console-tenants")
    shoot(page, screenshots, "console-tenants")
    # The browser logs the two refusals' 400s; nothing else.
    refused = [e for e in page_errors if "status of 400" in e and re.search(r"/operator/tenants/\d+(/quotas)?\)", e)]
    assert len(refused) == 2 and [e for e in page_errors if e not in refused] == [], page_errors


def test_an_operator_schedules_a_price_and_gives_a_tenant_its_own_book(
    tenants, pool, page: Page, page_errors, screenshots
):
    from datetime import timedelta

    from django.contrib.auth import get_user_model

    from billing import rating
    from billing import services as billing

    get_user_model().objects.create_user("operator", password="operator-password-1", is_staff=True)
    sign_in(page, "operator", "operator-password-1")
    page.get_by_role("link", name="Prices").click()
    expect(page).to_have_url(re.compile(r"/console/prices/$"))
    expect(page.locator('.book[data-book="standard"] tr[data-resource="h100-sxm"]')).to_be_visible(timeout=WAIT_MS)

    # A copy of the standard book, then a cheaper h100 in it from tomorrow.
    page.fill("#b-name", "research")
    page.select_option("#b-copy", label="standard")
    page.get_by_role("button", name="Create price book").click()
    expect(page.locator('.book[data-book="research"] tr[data-resource="h100-sxm"]')).to_be_visible(timeout=WAIT_MS)
    # Today is refused by name: usage already recorded keeps its price.
    page.select_option("#p-book", label="research")
    page.fill("#p-resource", "h100-sxm")
    page.fill("#p-per-hour", "2.00")
    page.eval_on_selector("#p-from", "(el) => { el.min = ''; el.value = new Date().toISOString().slice(0, 10); }")
    page.get_by_role("button", name="Schedule price").click()
    expect(page.locator("#price-errors")).to_contain_text("effective_from", timeout=WAIT_MS)
    expect(page.locator("#p-from")).to_have_attribute("aria-invalid", "true")
    tomorrow = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    page.fill("#p-from", tomorrow)
    page.get_by_role("button", name="Schedule price").click()
    scheduled = page.locator(f'.book[data-book="research"] tr[data-resource="h100-sxm"][data-from="{tomorrow}"]')
    expect(scheduled).to_contain_text("USD 2", timeout=WAIT_MS)

    # acme is billed by it from the next billing period on.
    page.get_by_label("Price book of acme", exact=True).select_option(label="research")
    page.get_by_role("button", name="Save the price book of acme").click()
    following = rating.next_period(billing.current_period())
    expect(page.locator('.book[data-book="research"]')).to_contain_text(
        f"from {following.isoformat()} also acme", timeout=WAIT_MS
    )
    assert billing.price_book_for(tenants[0].id, following).name == "research"
    assert billing.price_book_for(tenants[0].id).name == "standard"
    accessible(page, "console-prices")
    shoot(page, screenshots, "console-prices")
    refused = [e for e in page_errors if "status of 400" in e and "/prices)" in e]
    assert len(refused) == 1 and [e for e in page_errors if e not in refused] == [], page_errors
