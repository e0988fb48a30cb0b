"""The jobs app's metrics, read from the database at scrape time (``controlplane.metrics`` serves them).

Three levels, as the operators' dashboards read them (deploy/monitoring/):

- infrastructure, per device (labels flavor, node, device, vendor): the newest health reading's
  temperature, power and step jitter, the error counters, the health state and the predictor's score.
  Families that DCGM's exporter also has carry its names (``DCGM_FI_DEV_GPU_TEMP``, ...), so that a DCGM
  dashboard's queries find Polychip's devices too, NPUs and TPUs included (``vendor`` tells them apart);
- middleware: admission waits (a histogram the admission cycles add to), jobs by state, pending jobs by
  reason class, the last cycle's duration, evictions and recoveries by cause, time from freeze to the
  next step, quotas (nominal, borrowing limit, in use, borrowed), and the exchange per job class;
- application: one ``polychip_job_info`` series per running job with its identity, the running jobs'
  throughput, loss, goodput and balance efficiency, and the same summed per tenant.

Counters are counts of rows that only grow (health events, finished jobs, ended attempts), or totals the
workers add to; a gauge is what the rows say now. Every query is one aggregate or one pass over a
bounded set (devices, running jobs, tenants); nothing here scans a job's history.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import Any

from django.db.models import Count, Min
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from controlplane.exposition import LineGauge, label_text
from controlplane.monitoring import OTHER, HistogramTally, LabelBound, Tally
from jobs.admission import WAIT_BUCKETS
from jobs.models import (
    AdmissionLock,
    AdmissionWait,
    Device,
    DeviceEvent,
    DeviceHealth,
    JobAttempt,
    JobEvent,
    JobState,
    TrainingJob,
)
from jobs.snapshot import HOLDING_STATES, holding_jobs, tenant_quotas
from jobs.throughput import throughput_matrix
from runtime.jobspec import BUILTIN_MODELS
from runtime.recovery.health import FEATURES
from runtime.scheduling import NAU, QuotaLedger
from runtime.scheduling.model import MILLI

DEVICE_LABELS = ["flavor", "node", "device", "vendor"]
LIVE_STATES = (JobState.QUEUED, JobState.ADMITTED, JobState.RUNNING, JobState.RECOVERING)
FINISHED_STATES = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED)
# A job's class as a label: a built-in model by name, else its workload's kind (user code's classes
# are one per bundle, unbounded).
WORKLOAD_KINDS = ("python", "torchrun", "container")
PENDING_REASONS = ("undecided", "capacity", "quota", "budget", "making_room", "preempted", "recovering", "other")
INTERRUPTION_CAUSES = ("preempted", "reclaimed", "drained", "node", "heartbeat", "exit", "stopped", "other")
HEALTH_CHANGERS = ("operator", "recovery", "predictor", "cluster")
KILL_TO_RESUME_BUCKETS: tuple[float, ...] = (1, 2, 5, 8, 10, 15, 20, 30, 60, 120, 300, 600)
_TEMP, _POWER, _JITTER = (FEATURES.index(name) for name in ("temperature_c", "power_w", "step_jitter"))


def label_class(job_class: str) -> str:
    """``charlm`` stays; ``python:0a1b2c...:train.py`` becomes ``python``."""
    return job_class.split(":", 1)[0]


def pending_reason_class(reason: str) -> str:
    text = reason.lower()
    if not text:
        return "undecided"
    if text.startswith("making room"):
        return "making_room"
    if text.startswith(("preempted", "reclaimed")):
        return "preempted"
    if "budget" in text:
        return "budget"
    if "quota" in text or "may hold at most" in text:
        return "quota"
    if text.startswith("waiting for devices: needs at least"):
        return "recovering"
    if text.startswith("waiting for"):
        return "capacity"
    return "other"


def interruption_cause(reason: str) -> str:
    text = reason.lower()
    for cause, words in (
        ("reclaimed", ("reclaim",)),
        ("preempted", ("preempt",)),
        ("drained", ("drain", "predicted", "move")),
        ("node", ("node",)),
        ("heartbeat", ("heartbeat", "silent", "lost")),
        ("exit", ("exit", "code", "crash", "killed")),
        ("stopped", ("stop",)),
    ):
        if any(word in text for word in words):
            return cause
    return "other"


def health_changer(by: str) -> str:
    if by == "recovery":
        return "recovery"
    if by.startswith("failure predicted"):
        return "predictor"
    if by.startswith("cluster"):
        return "cluster"
    return "operator"


def families(bound: LabelBound, tenants: Mapping[int, str], now: datetime) -> Iterator[Metric]:
    """Every family of the jobs app. ``tenants``: slug by id, the tenant label's values."""
    bound.allow("job_class", [*BUILTIN_MODELS, *WORKLOAD_KINDS])

    def tenant(tenant_id: int) -> str:
        return bound("tenant", tenants.get(tenant_id, OTHER))

    yield from _devices(bound)
    yield from _admission(tenant, now)
    yield from _interruptions(tenant)
    yield from _quotas(tenant)
    yield from _running(bound, tenant, now)


# --- infrastructure ------------------------------------------------------------------------------


def _devices(bound: LabelBound) -> Iterator[Metric]:
    rows = list(
        Device.objects.order_by("device_id").values_list(
            "device_id",
            "node__name",
            "flavor__name",
            "flavor__vendor",
            "memory_gib",
            "health",
            "last_reading",
            "failure_score",
            "ecc_errors_total",
            "pcie_errors_total",
        )
    )
    bound.allow("flavor", {row[2] for row in rows})
    temp = LineGauge("DCGM_FI_DEV_GPU_TEMP", "Device temperature (C), newest reading")
    power = LineGauge("DCGM_FI_DEV_POWER_USAGE", "Device power draw (W), newest reading")
    fb_total = LineGauge("DCGM_FI_DEV_FB_TOTAL", "Device memory (MiB)")
    # Running totals under DCGM's exact names, typed gauge: prometheus_client writes a counter's TYPE
    # line with a "_total" that DCGM's names lack. rate() and increase() read them the same.
    ecc = LineGauge("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Corrected memory errors reported, ever (a running total)")
    pcie = LineGauge("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "PCIe errors reported, ever (a running total)")
    jitter = LineGauge("polychip_device_step_jitter", "Coefficient of variation of the step time, newest minute")
    health = LineGauge("polychip_device_health", "1 for the device's health state (label state)")
    score = LineGauge("polychip_device_failure_score", "The failure predictor's latest score (0..1)")
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for device_id, node, flavor, vendor, memory_gib, state, reading, failure_score, ecc_total, pcie_total in rows:
        labels = {"device": device_id, "flavor": flavor, "node": node, "vendor": vendor}
        text = label_text(labels)  # once for the device's every family
        counts[(flavor, state)] += 1
        fb_total.add(text, labels, memory_gib * 1024)
        ecc.add(text, labels, ecc_total)
        pcie.add(text, labels, pcie_total)
        # "state" sorts between "node" and "vendor"; the state is one of DeviceHealth's names.
        node_end = text.index(',vendor="')
        health.add(f'{text[:node_end]},state="{state}"{text[node_end:]}', {**labels, "state": state}, 1)
        if reading:
            temp.add(text, labels, reading[_TEMP])
            power.add(text, labels, reading[_POWER])
            jitter.add(text, labels, reading[_JITTER])
        if failure_score is not None:
            score.add(text, labels, failure_score)
    yield from (temp, power, fb_total, ecc, pcie, jitter, health, score)

    devices = GaugeMetricFamily(
        "polychip_devices", "Devices in the pool by flavor and health", labels=["flavor", "health"]
    )
    for (flavor, state), count in sorted(counts.items()):
        devices.add_metric([flavor, state], count)
    yield devices

    changes = CounterMetricFamily(
        "polychip_device_health_changes",
        "Devices moved to a health state, by who moved them",
        labels=["to", "by"],
    )
    tally: dict[tuple[str, str], int] = defaultdict(int)
    for to_health, by, count in (
        DeviceEvent.objects.filter(kind=DeviceEvent.Kind.HEALTH)
        .values_list("to_health", "by")
        .annotate(n=Count("id"))
        .order_by()
    ):
        tally[(to_health, health_changer(by))] += count
    for state in DeviceHealth.values:
        for changer in HEALTH_CHANGERS:
            changes.add_metric([state, changer], tally.get((state, changer), 0))
    yield changes


# --- middleware ----------------------------------------------------------------------------------


def _admission(tenant: Any, now: datetime) -> Iterator[Metric]:
    waits = HistogramMetricFamily(
        "polychip_admission_wait_seconds",
        "Time from submission to admission of the jobs admitted",
        labels=["tenant", "priority"],
    )
    wait_tally = HistogramTally(WAIT_BUCKETS)
    for row in AdmissionWait.objects.order_by("tenant_id", "band"):
        cumulative = list(row.buckets) or [0] * (len(WAIT_BUCKETS) + 1)
        wait_tally.add([tenant(row.tenant_id), row.band], [*cumulative[: len(WAIT_BUCKETS)], cumulative[-1]], row.sum_s)
    yield wait_tally.into(waits)

    live = GaugeMetricFamily("polychip_jobs", "Jobs in each live state", labels=["tenant", "state"])
    finished = CounterMetricFamily("polychip_jobs_finished", "Jobs that ended, by how", labels=["tenant", "state"])
    by_state = (
        TrainingJob.objects.values_list("tenant_id", "state").annotate(n=Count("id")).order_by("tenant_id", "state")
    )
    live_tally, finished_tally = Tally(), Tally()
    for tenant_id, state, count in by_state:
        (finished_tally if state in FINISHED_STATES else live_tally).add([tenant(tenant_id), state], count)
    yield live_tally.into(live)
    yield finished_tally.into(finished)

    pending = GaugeMetricFamily("polychip_pending_jobs", "Queued jobs by why they wait", labels=["tenant", "reason"])
    classes: dict[tuple[str, str], int] = defaultdict(int)
    reasons = (
        TrainingJob.objects.filter(state=JobState.QUEUED)
        .values_list("tenant_id", "pending_reason")
        .annotate(n=Count("id"))
        .order_by()
    )
    for tenant_id, reason, count in reasons:
        classes[(tenant(tenant_id), pending_reason_class(reason))] += count
    for (slug, reason_class), count in sorted(classes.items()):
        pending.add_metric([slug, reason_class], count)
    yield pending

    # The wait histogram counts only jobs admitted: a tenant starved outright shows here.
    oldest = GaugeMetricFamily(
        "polychip_oldest_pending_job_age_seconds",
        "How long the tenant's oldest queued job has waited",
        labels=["tenant"],
    )
    firsts = (
        TrainingJob.objects.filter(state=JobState.QUEUED)
        .values_list("tenant_id")
        .annotate(first=Min("state_changed_at"))  # since it last entered the queue
        .order_by("tenant_id")
    )
    oldest_tally = Tally(combine=max)
    for tenant_id, first in firsts:
        oldest_tally.add([tenant(tenant_id)], max(0.0, (now - first).total_seconds()))
    yield oldest_tally.into(oldest)

    lock = AdmissionLock.objects.filter(pk=1).values_list("last_cycle_at", "last_cycle_s").first()
    cycle = GaugeMetricFamily("polychip_admission_cycle_seconds", "How long the last admission cycle took")
    last = GaugeMetricFamily("polychip_admission_last_cycle_timestamp_seconds", "When the last admission cycle ran")
    if lock is not None and lock[0] is not None:
        last.add_metric([], lock[0].timestamp())
        if lock[1] is not None:
            cycle.add_metric([], lock[1])
    yield cycle
    yield last


def _interruptions(tenant: Any) -> Iterator[Metric]:
    evictions = CounterMetricFamily(
        "polychip_evictions", "Attempts stopped to give their devices to other work", labels=["tenant", "reason"]
    )
    recoveries = CounterMetricFamily(
        "polychip_recoveries",
        "Attempts frozen after a failure or a move, to be placed again",
        labels=["tenant", "cause"],
    )
    tally: dict[tuple[str, str, str], int] = defaultdict(int)
    ended = (
        JobAttempt.objects.filter(ended_as__in=[JobState.QUEUED, JobState.RECOVERING])
        .values_list("job__tenant_id", "ended_as", "end_reason")
        .annotate(n=Count("id"))
        .order_by()
    )
    for tenant_id, ended_as, reason, count in ended:
        tally[(tenant(tenant_id), ended_as, interruption_cause(reason))] += count
    for (slug, ended_as, cause), count in sorted(tally.items()):
        (evictions if ended_as == JobState.QUEUED else recoveries).add_metric([slug, cause], count)
    yield evictions
    yield recoveries

    resumed = HistogramMetricFamily(
        "polychip_kill_to_resume_seconds", "From a job's freeze to its next attempt's first step"
    )
    seconds = [
        float(data["resumed"]["since_frozen_s"])
        for data in JobEvent.objects.filter(kind=JobEvent.Kind.RECOVERY, data__has_key="resumed").values_list(
            "data", flat=True
        )
        if isinstance(data.get("resumed"), dict) and isinstance(data["resumed"].get("since_frozen_s"), int | float)
    ]
    buckets = [(str(float(bound)), sum(1 for s in seconds if s <= bound)) for bound in KILL_TO_RESUME_BUCKETS]
    resumed.add_metric([], [*buckets, ("+Inf", len(seconds))], sum(seconds))
    yield resumed


def _quotas(tenant: Any) -> Iterator[Metric]:
    quotas = tenant_quotas()
    ledger = QuotaLedger(quotas, holding_jobs(throughput_matrix().rates(["synthetic-mlp"])))
    names = ("nominal", "borrowing_limit", "usage", "borrowed")
    helps = (
        "The tenant's nominal quota",
        "How much more than nominal the tenant may borrow from its cohort",
        "What the tenant's admitted and running jobs hold",
        "What the tenant holds beyond its nominal quota",
    )
    gauges = [
        GaugeMetricFamily(
            f"polychip_quota_{name}", f"{text} (devices; NAU for resource nau)", labels=["tenant", "resource"]
        )
        for name, text in zip(names, helps, strict=True)
    ]

    def show(resource: str, amount: int) -> float:
        return amount / MILLI if resource == NAU else float(amount)

    tallies = [Tally() for _ in gauges]
    for tenant_id in sorted(quotas):
        usage = ledger.usage(tenant_id)
        slug = tenant(tenant_id)
        for resource, limit in sorted(quotas[tenant_id].limits.items()):
            in_use = usage.get(resource, 0)
            values = (limit.nominal, limit.borrowing_limit, in_use, max(0, in_use - limit.nominal))
            for tally, value in zip(tallies, values, strict=True):
                if value is not None:
                    tally.add([slug, resource], show(resource, value))
    for gauge, tally in zip(gauges, tallies, strict=True):
        yield tally.into(gauge)


# --- application ---------------------------------------------------------------------------------


def _running(bound: LabelBound, tenant: Any, now: datetime) -> Iterator[Metric]:
    running = list(
        TrainingJob.objects.filter(state=JobState.RUNNING)
        .order_by("pk")
        .only(
            "pk",
            "tenant_id",
            "name",
            "job_class",
            "attempt",
            "spec",
            "steps_done",
            "total_steps",
            "last_loss",
            "samples_per_s",
            "balance_stats",
            "comm_stats",
        )
    )
    first_steps = dict(
        JobAttempt.objects.filter(job_id__in=[job.pk for job in running], first_step_at__isnull=False)
        .values_list("job_id")
        .annotate(first=Min("first_step_at"))
        .order_by()
    )
    info = GaugeMetricFamily(
        "polychip_job_info",
        "1 per running job: its identity (join other polychip_job_* series on job_id)",
        labels=["job_id", "tenant", "name", "job_class", "attempt"],
    )
    per_job = {
        "samples_per_second": "The gang's samples/s, as rank 0 measures it",
        "loss": "The newest training loss",
        "goodput_samples_per_second": "Samples that counted per second since the first step (redone steps and "
        "restarts excluded)",
        "balance_efficiency": "The balancer's split efficiency (1: no rank waits for another)",
        "progress_ratio": "Steps done over steps to do",
    }
    job_gauges = {
        key: GaugeMetricFamily(f"polychip_job_{key}", text, labels=["job_id"]) for key, text in per_job.items()
    }
    tenant_rate: dict[str, float] = defaultdict(float)
    tenant_goodput: dict[str, float] = defaultdict(float)
    comm_time: dict[str, list[float]] = defaultdict(list)
    comm_bytes: dict[str, float] = defaultdict(float)
    for job in running:
        job_id, slug, job_class = str(job.pk), tenant(job.tenant_id), bound("job_class", label_class(job.job_class))
        info.add_metric([job_id, slug, job.name[:63], job_class, str(job.attempt)], 1)
        values: dict[str, float | None] = {
            "samples_per_second": job.samples_per_s,
            "loss": job.last_loss,
            "balance_efficiency": job.balance_stats.get("efficiency"),
            "progress_ratio": job.steps_done / job.total_steps if job.total_steps else None,
        }
        first = first_steps.get(job.pk)
        batch = int((job.spec.get("workload") or {}).get("global_batch") or 0)
        if first is not None and batch:
            elapsed = max(1.0, (now - first).total_seconds())
            values["goodput_samples_per_second"] = job.steps_done * batch / elapsed
            tenant_goodput[slug] += values["goodput_samples_per_second"] or 0.0
        for key, value in values.items():
            if value is not None:
                job_gauges[key].add_metric([job_id], float(value))
        tenant_rate[slug] += job.samples_per_s or 0.0
        step = job.comm_stats.get("last_step") or {}
        if isinstance(step.get("collective_s"), int | float):
            comm_time[job_class].append(float(step["collective_s"]))
        if isinstance(step.get("comm_bytes_cross"), int | float):
            comm_bytes[job_class] += float(step["comm_bytes_cross"])
    yield info
    yield from job_gauges.values()

    collective = GaugeMetricFamily(
        "polychip_collective_seconds", "Mean collective time per step of the running jobs", labels=["job_class"]
    )
    for job_class, times in sorted(comm_time.items()):
        collective.add_metric([job_class], sum(times) / len(times))
    yield collective
    cross = GaugeMetricFamily(
        "polychip_cross_group_bytes",
        "Bytes sent across vendor groups per step, summed over the running jobs",
        labels=["job_class"],
    )
    for job_class, total in sorted(comm_bytes.items()):
        cross.add_metric([job_class], total)
    yield cross

    rate = GaugeMetricFamily("polychip_tenant_samples_per_second", "Running jobs' samples/s", labels=["tenant"])
    goodput = GaugeMetricFamily(
        "polychip_tenant_goodput_samples_per_second", "Running jobs' goodput", labels=["tenant"]
    )
    held = GaugeMetricFamily(
        "polychip_tenant_devices_held", "Devices held by admitted and running jobs", labels=["tenant"]
    )
    for slug, value in sorted(tenant_rate.items()):
        rate.add_metric([slug], value)
    for slug, value in sorted(tenant_goodput.items()):
        goodput.add_metric([slug], value)
    holding = (
        TrainingJob.objects.filter(state__in=HOLDING_STATES, allocations__ended_at__isnull=True)
        .values_list("tenant_id")
        .annotate(n=Count("allocations"))
        .order_by()
    )
    held_tally = Tally()
    for tenant_id, count in holding:
        held_tally.add([tenant(tenant_id)], count)
    yield rate
    yield goodput
    yield held_tally.into(held)
