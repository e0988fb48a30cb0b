"""``/metrics``: the control plane in the Prometheus text format, for operators and their scrapers.

Who may read it: a signed-in operator (a staff session, as the console's), or a scraper that sends
``Authorization: Bearer <POLYCHIP_METRICS_TOKEN>``. Anyone else gets 401 (no credentials) or 403.

What it says is read from the database at scrape time: by the jobs app's ``metric_families``, by
``controlplane.billing_metrics`` (billing's figures through its services; billing/ holds no float) and by
this module (the Celery workers' task counts, the broker's queue): every process of
the control plane answers the same, and no process keeps metric files. Labels are bounded
(``controlplane.monitoring``): a value out of its label's set is counted under ``_other`` and in
``polychip_metrics_label_overflow``. docs/monitoring.md lists every family.
"""

from __future__ import annotations

import functools
import gc
import hmac
import threading
import time
from collections.abc import Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from controlplane import billing_metrics, exposition, taskstats
from controlplane.monitoring import OTHER, HistogramTally, LabelBound, Tally
from jobs import services as jobs
from tenants import services as tenants

# The classic text format, which controlplane.exposition writes (prometheus_client's own constant names
# a newer version of it).
TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"
_last_collect_s = 0.0


@functools.cache
def _task_names() -> frozenset[str]:
    """The Celery app's tasks (the task label's values): the web process imports the apps' tasks
    modules for it, as a worker does at start."""
    from controlplane.celery import app

    app.loader.import_default_modules()
    return frozenset(name for name in app.tasks if not name.startswith("celery."))


def _task_families(bound: LabelBound) -> Iterator[Metric]:
    bound.allow("task", _task_names())
    counts = CounterMetricFamily(
        "polychip_celery_tasks", "Celery tasks run, by how they ended", labels=["task", "state"]
    )
    runtime = HistogramMetricFamily("polychip_celery_task_runtime_seconds", "Celery task runtimes", labels=["task"])
    count_tally, runtime_tally = Tally(), HistogramTally(taskstats.RUNTIME_BUCKETS)
    for totals in taskstats.task_totals():
        name = bound("task", totals.task)
        for state in taskstats.OUTCOMES:
            count_tally.add([name, state], getattr(totals, state))
        runtime_tally.add([name], totals.runtime_buckets, totals.runtime_sum_s)
    yield count_tally.into(counts)
    yield runtime_tally.into(runtime)
    workers = GaugeMetricFamily(
        "polychip_celery_workers", f"Celery workers whose heartbeat came within {taskstats.WORKER_ALIVE_S:.0f} s"
    )
    workers.add_metric([], taskstats.live_workers())
    yield workers
    queue = GaugeMetricFamily("polychip_celery_queue_length", "Tasks waiting in the broker", labels=["queue"])
    for name, length in taskstats.queue_lengths().items():
        queue.add_metric([name], length)
    yield queue


class ControlPlaneCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        global _last_collect_s
        started = time.perf_counter()
        now = timezone.now()
        bound = LabelBound()
        slugs = tenants.all_tenant_slugs()
        bound.allow("tenant", slugs.values())

        def tenant(tenant_id: int) -> str:
            return bound("tenant", slugs.get(tenant_id, OTHER))

        yield from jobs.metric_families(bound, slugs, now)
        yield from billing_metrics.families(tenant, now)
        yield from _task_families(bound)

        # A gauge of this scrape's misses, not a counter: every process answers /metrics, and a
        # counter kept in each would go up and down as scrapes land on one process or another.
        overflow = GaugeMetricFamily(
            "polychip_metrics_label_overflow",
            "Label values outside their label's set in this scrape, shown as _other instead",
            labels=["label"],
        )
        for label in sorted({"tenant", "task", "job_class", "flavor", *bound.overflow}):
            overflow.add_metric([label], bound.overflow.get(label, 0))
        yield overflow
        took = GaugeMetricFamily("polychip_metrics_collect_seconds", "How long the previous scrape's reads took")
        took.add_metric([], _last_collect_s)
        yield took
        _last_collect_s = time.perf_counter() - started


registry = CollectorRegistry(auto_describe=False)
registry.register(ControlPlaneCollector())


def _allowed(request: HttpRequest) -> int | None:
    """None when the request may read the metrics, else the status to refuse it with."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated and user.is_staff:
        return None
    header = request.headers.get("Authorization", "")
    token = settings.POLYCHIP_METRICS_TOKEN
    if header.startswith("Bearer "):
        given = header.removeprefix("Bearer ").strip()
        if token and hmac.compare_digest(given.encode(), token.encode()):
            return None
        return 403
    return 403 if user is not None and user.is_authenticated else 401


@require_GET
def metrics_view(request: HttpRequest) -> HttpResponse:
    refused = _allowed(request)
    if refused == 401:
        message = "sign in as an operator, or send Authorization: Bearer <POLYCHIP_METRICS_TOKEN>"
        response = JsonResponse({"error": {"code": "not_authenticated", "message": message}}, status=401)
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    if refused == 403:
        message = "only operators and the scrape token (POLYCHIP_METRICS_TOKEN) may read /metrics"
        return JsonResponse({"error": {"code": "permission_denied", "message": message}}, status=403)
    return HttpResponse(scrape(), content_type=TEXT_FORMAT)


_scrape_lock = threading.Lock()


def scrape() -> bytes:
    """The whole text. One scrape at a time per process (scrapers come every 15 s or so; two at once
    would only double the database's work), with the garbage collector paused: the 70,000 series of a
    large pool are as many new objects, and the collections they set off took up to half the time."""
    with _scrape_lock:
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            return exposition.render(registry.collect())
        finally:
            if was_enabled:
                gc.enable()
