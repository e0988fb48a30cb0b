"""The portal at scale and live (issue 20): page server times with 100,000 jobs, and a change in the
database reaching the page in a real browser.

    python bench/portal.py [--quick]

- pages: the portal's and the console's pages rendered (each must answer 200).
- jobs_list_p95_ms_100k: the jobs page's server time (Django's test client in this process, a signed-in
  session, PostgreSQL) with 100,000 jobs of the tenant in the database (bench/api.py's seed: 90% ended,
  10% waiting): the first page, a page deep in the history (by its cursor), and a filtered page, in turn;
  200 requests (60 with --quick). Target: <= 300 ms.
- job_page_p95_ms: one job's page, the same way.
- axe_serious: axe-core (npm) run in that browser on every page above, as the tenant or the operator;
  the serious and critical violations, summed. Target: 0.
- ws_event_to_dom_ms_p50: a uvicorn server on the same database, the jobs page open in Debian's
  Chromium; a job the bench submits (it waits: nothing admits it) is cancelled through the API, and the
  time from the cancel's answer to its row showing "cancelled" (a MutationObserver's clock, the same
  host's) is taken; 20 times (8 with --quick).
  Target: <= 250 ms.
- chart_points_to_dom_ms_p50: the page of a waiting job of the bench's open; a loss point stored the way
  telemetry ingest stores it (``jobs.metrics.record_points``, in this process), and the time from its
  commit to the loss chart holding it (its ``data-points`` count, a MutationObserver's clock); as many
  trials as above. Target: <= 250 ms.
- log_line_to_dom_ms_p50: on the same page, following the job's logs: a line appended to rank 0's log
  by the writer the local supervisor uses (``CappedLog``), in a run folder the job's attempt points to
  (made by the bench, with a stand-in process in the supervisor's place, so the run counts as live),
  and the time from the write to the line in the page's log box; as many trials. Target: <= 250 ms.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.admission import PG  # noqa: E402
from bench.admission import setup_django as setup_scratch_django  # noqa: E402
from bench.api import JOBS, SUBMIT, seed  # noqa: E402
from bench.skeleton import free_port  # noqa: E402

T = TypeVar("T")
BENCH_DB = "polychip_bench_portal"
CHROMIUM = "/usr/bin/chromium"
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"  # from npm (make install)
# Every page, by who may see it ("{job}": a job's id); the jobs list last, where the latency trials run.
TENANT_PAGES = ("/jobs/{job}", "/submit/", "/billing/", "/tokens/", "/")
OPERATOR_PAGES = ("/console/", "/console/queue/", "/console/tenants/", "/console/prices/")
AXE_RUN = "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
PASSWORD = "pw-123456789"  # bench/api.py's seeded user
# In the page: the moment (its clock, this host's) the job's row first shows "cancelled".
WATCH_ROW = """(id) => {
  window.__seen = null;
  const row = document.querySelector(`#jobs tr[data-job="${id}"]`);
  new MutationObserver((_, observer) => {
    if (row.dataset.state !== "cancelled" || window.__seen !== null) return;
    window.__seen = Date.now();
    observer.disconnect();
  }).observe(row, {attributes: true, childList: true});
}"""


def say(line: str) -> None:
    print(line, flush=True)


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))], 1)


def server_times(tenant_id: int, requests: int) -> dict[str, Any]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    from controlplane import paging
    from jobs.models import TrainingJob

    client = Client()
    client.force_login(get_user_model().objects.get(username="acme-user"))
    operator = Client()
    operator.force_login(get_user_model().objects.create_user("bench-op", password=PASSWORD, is_staff=True))
    deep = TrainingJob.objects.filter(tenant_id=tenant_id).order_by("pk").values_list("pk", flat=True)[JOBS // 10]
    job_id = (
        TrainingJob.objects.filter(tenant_id=tenant_id, state="queued").order_by("-pk").values_list("pk", flat=True)[0]
    )
    lists = ["/", f"/?cursor={paging.encode_cursor(deep)}", "/?state=failed&name=seeded-9"]
    pages = [(client, path.format(job=job_id)) for path in TENANT_PAGES]
    pages += [(operator, path) for path in OPERATOR_PAGES]
    for who, path in pages:
        status = who.get(path).status_code
        assert status == 200, f"{path} answered {status}"
    timings: dict[str, list[float]] = {"list": [], "job": []}
    for n in range(requests):
        for kind, path in (("list", lists[n % len(lists)]), ("job", f"/jobs/{job_id}")):
            started = time.perf_counter()
            response = client.get(path)
            timings[kind].append((time.perf_counter() - started) * 1000)
            assert response.status_code == 200, (path, response.status_code)
    return {"pages": len(pages), "list": timings["list"], "job": timings["job"]}


def axe_serious(page: Any, paths: list[str]) -> list[str]:
    """axe-core's serious and critical violations on each page, as served (the script goes in through
    Playwright, which the pages' Content-Security-Policy does not govern); one line each."""
    found: list[str] = []
    for path in paths:
        page.goto(path)  # to "load"; the live pages never go network-idle (sockets, followed logs)
        page.wait_for_timeout(1000)  # their scripts fill them from the API
        page.evaluate(AXE.read_text())
        for violation in page.evaluate(AXE_RUN):
            if violation["impact"] in ("serious", "critical"):
                nodes = violation["nodes"]
                found.append(
                    f"{path}: {violation['id']} ({violation['impact']}) "
                    f"at {nodes[0]['target']} and {len(nodes) - 1} more"
                )
    return found


# In the page: the moment an element's data-<key> count first reaches a number.
WATCH_COUNT = """([selector, key, target]) => {
  window.__seen = null;
  const element = document.querySelector(selector);
  const check = () => {
    if (window.__seen === null && Number(element.dataset[key]) >= target) window.__seen = Date.now();
  };
  new MutationObserver(check).observe(element, {attributes: true, childList: true, subtree: true});
  check();
}"""


def seen_after(page: Any, since_ms: float, what: str) -> float:
    """Milliseconds from ``since_ms`` to the moment the page's watcher saw its change."""
    # Polled from here: the page's CSP refuses the eval that wait_for_function's predicate needs.
    deadline = time.monotonic() + 30
    while page.evaluate("window.__seen") is None:
        assert time.monotonic() < deadline, f"{what} never reached the page"
        page.wait_for_timeout(5)
    return float(max(0.0, page.evaluate("window.__seen") - since_ms))


# Django code runs on a thread of its own (one, so one database connection): Playwright's sync API
# keeps an event loop on the main thread, where Django refuses to query.
_django_thread = ThreadPoolExecutor(max_workers=1)


def off_loop(fn: Callable[[], T]) -> T:
    return _django_thread.submit(fn).result()


def live_run(job_id: int, scratch: str) -> tuple[Path, subprocess.Popen[bytes]]:
    """A run folder for the job's attempt 0 that the local backend reads as live: a running status and
    a stand-in process, named by the folder, in the supervisor's place."""
    from jobs.models import JobAttempt

    run_dir = Path(scratch) / "runs" / f"job-{job_id}"
    run_dir.mkdir(parents=True)
    handle = {"backend": "local", "run_dir": str(run_dir), "job_id": f"job-{job_id}"}
    off_loop(lambda: JobAttempt.objects.filter(job_id=job_id, number=0).update(backend_handle=handle))
    stand_in = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)", str(run_dir)])
    (run_dir / "supervisor.pid").write_text(f"{stand_in.pid}\n")
    (run_dir / "status.json").write_text(json.dumps({"phase": "running", "updated_at": time.time(), "ranks": []}))
    return run_dir, stand_in


def chart_and_log_latencies(page: Any, job_id: int, scratch: str, trials: int) -> tuple[list[float], list[float]]:
    """On the job's page: a stored point to the chart holding it, and a written log line to the log box."""
    from jobs.metrics import ReportedPoint, record_points
    from runtime.backends.local.logs import CappedLog

    run_dir, stand_in = live_run(job_id, scratch)
    log = CappedLog(run_dir / "rank0.log")
    try:
        page.goto(f"/jobs/{job_id}")
        page.wait_for_selector("#live.on", timeout=30_000)
        deadline = time.monotonic() + 30
        while page.text_content("#logs-status") != "following":
            assert time.monotonic() < deadline, "the job page never started following its logs"
            page.wait_for_timeout(20)
        charts: list[float] = []
        for step in range(trials):
            page.evaluate(WATCH_COUNT, ["#chart-loss", "points", step + 1])
            point = ReportedPoint("loss", step, 1.0 / (step + 1))
            off_loop(lambda: record_points(job_id, 0, [point]))  # noqa: B023 (called before the next step)
            charts.append(seen_after(page, time.time() * 1000, f"loss point {step}"))
        lines: list[float] = []
        for n in range(trials):
            page.evaluate(WATCH_COUNT, ["#logs", "lines", n + 1])
            log.write("out", [f"bench line {n}".encode()], at=time.time())
            lines.append(seen_after(page, time.time() * 1000, f"log line {n}"))
        return charts, lines
    finally:
        log.close()
        stand_in.kill()
        stand_in.wait()


def sign_in(page: Any, username: str) -> None:
    page.goto("/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)


def live_latencies(token: str, trials: int, scratch: str) -> tuple[dict[str, list[float]], list[str]]:
    """The cancel-to-row, point-to-chart and line-to-log latencies, and axe's serious findings on every
    page, all against one server."""
    import httpx
    from playwright.sync_api import sync_playwright

    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CELERY_", "CHANNEL_", "POLYCHIP_"))}
    env.update(DATABASE_URL=f"{PG}/{BENCH_DB}", CELERY_BROKER_URL="memory://", POLYCHIP_VAR_DIR=scratch)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "controlplane.asgi:application",
            "--port",
            str(port),
            "--log-level",
            "warning",
        ],
        env=env,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(120):
            try:
                if httpx.get(f"{url}/healthz", timeout=2).is_success:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        api = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        # Jobs of its own, submitted now: the newest, so on the page's first screen (nothing admits them:
        # the server's broker goes nowhere).
        waiting = [api.post("/api/v1/jobs", json={**SUBMIT, "name": f"ws-{n}"}).json()["id"] for n in range(trials)]
        charted = api.post("/api/v1/jobs", json={**SUBMIT, "name": "charted"}).json()["id"]
        out: dict[str, list[float]] = {"row": []}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
            )
            operator = browser.new_page(base_url=url)
            sign_in(operator, "bench-op")
            violations = axe_serious(operator, list(OPERATOR_PAGES))
            page = browser.new_page(base_url=url)
            sign_in(page, "acme-user")
            violations += axe_serious(page, [path.format(job=waiting[0]) for path in TENANT_PAGES])
            page.wait_for_selector("#live.on", timeout=30_000)
            for job_id in waiting:
                page.wait_for_selector(f'#jobs tr[data-job="{job_id}"]', timeout=30_000)
                page.evaluate(WATCH_ROW, job_id)
                answer = api.post(f"/api/v1/jobs/{job_id}/cancel")
                answered_ms = time.time() * 1000
                assert answer.status_code == 200, answer.text
                out["row"].append(seen_after(page, answered_ms, f"job {job_id}'s cancelled state"))
            out["chart"], out["log"] = chart_and_log_latencies(page, charted, scratch, trials)
            browser.close()
        return out, violations
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer requests and trials, the same figures")
    args = parser.parse_args()
    requests, trials = (60, 8) if args.quick else (200, 20)
    setup_scratch_django(BENCH_DB, "bench-portal")
    started = time.monotonic()
    tenant_id, token = seed(JOBS)
    say(f"seeded {JOBS} jobs in {time.monotonic() - started:.0f} s")
    times = server_times(tenant_id, requests)
    figures: dict[str, Any] = {"quick": args.quick, "pages": times["pages"]}
    figures["jobs_list_p95_ms_100k"] = p95(times["list"])
    figures["job_page_p95_ms"] = p95(times["job"])
    say(
        f"jobs page p95 {figures['jobs_list_p95_ms_100k']} ms (p50 {statistics.median(times['list']):.1f}), "
        f"job page p95 {figures['job_page_p95_ms']} ms, over {requests} requests each"
    )
    latencies, violations = live_latencies(token, trials, tempfile.mkdtemp(prefix="polychip-bench-portal-"))
    figures["axe_serious"] = len(violations)
    say(f"axe-core, serious or critical, on {times['pages']} pages: {len(violations)}")
    for line in violations:
        say(f"  {line}")
    for figure, key, what in (
        ("ws_event_to_dom_ms_p50", "row", "cancel answered to row changed"),
        ("chart_points_to_dom_ms_p50", "chart", "point stored to chart drawn"),
        ("log_line_to_dom_ms_p50", "log", "log line written to line shown"),
    ):
        figures[figure] = round(statistics.median(latencies[key]), 1)
        say(f"{what}: p50 {figures[figure]} ms, max {max(latencies[key]):.0f} ms over {len(latencies[key])} trials")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
