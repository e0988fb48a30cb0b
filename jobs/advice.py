"""The advisor at submit: what submitting a spec now would do, and how the job would run, in words.

One call, storing nothing, answers six questions, each from figures the control plane already holds and
each with the sentences that say which (``jobs.contracts.JobAdvice``):

- admission: whether the next cycle would start it and where, why it would wait, or why it never could
  (``capacity``: one cycle of the scheduler on the live snapshot; one on an idle pool for "never");
- start: when, from the live queue played forward by the same scheduler
  (``runtime.simulate.forecast``), each holding job ending at its steps left and measured speed, each
  waiting job running at the throughput table's speed on the devices the replay gives it;
- batch: each flavor's micro-batch within about 70% of its memory and the accumulation micro-steps on
  the placement (``runtime.balancing``), from the built-in models' memory figures;
- checkpoint: Young's and Daly's intervals (``runtime.recovery.advisor``) from the save cost that jobs
  of the class measured, the pool's failure rate and the step time on the placement;
- comm: what ``compression: auto`` would choose on the placement's cross-group link
  (``runtime.comm.auto``);
- cost: the NAU charge and an hour at the tenant's prices (``billing``).

The placement the last four speak of is where the job starts now, else where the replay starts it,
else where it would go on an idle pool. A figure the control plane does not have (the size of a
tenant's own code, a speed nobody measured, a save cost no job reported) is said to be missing, with
what would supply it, and the numbers that need it are None.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone

from billing import services as billing
from jobs import capacity
from jobs.admission import placement_policy
from jobs.contracts import (
    AdmissionAdvice,
    BatchAdvice,
    CheckpointAdvice,
    CommAdvice,
    CostAdvice,
    FlavorBatchAdvice,
    JobAdvice,
    StartAdvice,
)
from jobs.lifecycle import check_workload
from jobs.models import Flavor, JobState, TrainingJob
from jobs.queries import pool_failure_rate
from jobs.snapshot import load_snapshot
from jobs.throughput import table as throughput_table
from jobs.throughput import throughput_matrix
from runtime.balancing import BalancingError, max_micro_batch, proportional_split
from runtime.comm.auto import choose_policy, exchange_members, lowrank_numbers
from runtime.inventory.steptime import LinkModel
from runtime.jobspec import BUILTIN_MODELS, JobSpec, WorkloadSpec
from runtime.recovery.advisor import advise as advise_intervals
from runtime.recovery.advisor import job_mtbf_s
from runtime.scheduling import AdmittedJob, PendingJob, Snapshot
from runtime.scheduling.model import MILLI
from runtime.simulate.forecast import Forecast, Work, forecast_starts
from runtime.throughput import ThroughputTable
from runtime.worker.builtin.shapes import memory_figures, param_shapes

# The share of a device's memory that a rank's micro-batch may fill (``runtime.worker.config.memory_cap``).
MEMORY_BUDGET = 0.7
# Recent jobs whose measured figures (save cost, cross-group link) the advice takes the median of.
RECENT_JOBS = 20
_BUILTIN_ONLY = "Polychip has a memory model for the built-in models only (synthetic-mlp, charlm, digits-cnn)"


def advise(*, tenant_id: int, spec: JobSpec, now: datetime | None = None) -> JobAdvice:
    """Everything the advisor says of ``spec`` if ``tenant_id`` submitted it now; stores nothing.
    Raises what submit raises for a workload the installation cannot run (``check_workload``)."""
    check_workload(tenant_id=tenant_id, spec=spec)
    now = now or timezone.now()
    flavors = {f.name: f for f in Flavor.objects.filter(name__in=spec.flavors)}
    table = throughput_table()
    speeds = _Speeds(table)
    idle_placement, never = capacity.idle_pool_placement(tenant_id=tenant_id, spec=spec)
    placement: dict[str, int]
    if never is not None:
        admission = AdmissionAdvice("never", never, {}, False, 0, (f"Never: {never}.",))
        start = StartAdvice(None, None, 0, 0, ("No start time: it could never start on this pool.",))
        placement, where = {}, "none"
    else:
        admission, start, placement, where = _admission_and_start(tenant_id, spec, now, speeds)
        if not placement:
            placement, where = idle_placement, "idle pool"
    step_time_s = _step_time_s(spec, placement, speeds)
    return JobAdvice(
        admission=admission,
        start=start,
        batch=_batch(spec, flavors, placement, where, table),
        checkpoint=_checkpoint(tenant_id, spec, step_time_s, placement),
        comm=_comm(spec, flavors, placement),
        cost=_cost(tenant_id, spec, placement, where),
    )


# --- speeds ----------------------------------------------------------------------------------------


class _Speeds:
    """Samples/s per device from the throughput table, for classes it has a real figure for (measured or
    benchmarked on some flavor; other flavors scaled from it by their peaks). A class nobody measured has
    no speed: the table's unit estimate tells ratios between flavors, not seconds."""

    def __init__(self, table: ThroughputTable) -> None:
        self.table = table
        self.known = table.job_classes()
        self._cache: dict[tuple[str, str, int], float | None] = {}

    def per_device(self, job_class: str, flavor: str, gang: int) -> float | None:
        key = (job_class, flavor, max(1, gang))
        if key not in self._cache:
            speed = None
            if job_class in self.known:
                try:
                    speed = self.table.lookup(*key).per_device
                except LookupError:
                    speed = None
            self._cache[key] = speed
        return self._cache[key]

    def of_gang(self, job_class: str, devices: Mapping[str, int]) -> float | None:
        """A gang's samples/s: the sum of its devices' (what the balancer's split approaches)."""
        gang = sum(devices.values())
        rates = [self.per_device(job_class, flavor, gang) for flavor in devices]
        if not devices or any(rate is None for rate in rates):
            return None
        return sum(count * (rate or 0.0) for count, rate in zip(devices.values(), rates, strict=True))


def _step_time_s(spec: JobSpec, placement: Mapping[str, int], speeds: _Speeds) -> float | None:
    rate = speeds.of_gang(spec.workload.job_class, placement)
    return spec.workload.global_batch / rate if rate else None


# --- admission and start ---------------------------------------------------------------------------


def _admission_and_start(
    tenant_id: int, spec: JobSpec, now: datetime, speeds: _Speeds
) -> tuple[AdmissionAdvice, StartAdvice, dict[str, int], str]:
    hypothetical, over_budget = capacity.with_hypothetical(load_snapshot(now), tenant_id=tenant_id, spec=spec)
    preview = capacity.preview_of(hypothetical, over_budget, tenant_id=tenant_id, spec=spec)
    if preview.starts_now or preview.preempts:
        where = _devices_words(preview.devices)
        borrowing = " (borrowing from the cohort)" if preview.borrowing else ""
        sentences = [f"Would be admitted now, on {where}{borrowing}"]
        if preview.preempts:
            # Counted, not named: they may be other tenants' jobs.
            sentences.append(f"First it would preempt {len(preview.preempts)} job(s) running on borrowed capacity")
        reason = f"would preempt {len(preview.preempts)} job(s) first" if preview.preempts else ""
        admission = AdmissionAdvice(
            "now", reason, preview.devices, preview.borrowing, len(preview.preempts), _sentences(sentences)
        )
        start = StartAdvice(now, 0.0, 0, 0, ("Expected start: at the next admission cycle, in seconds.",))
        return admission, start, dict(preview.devices), "now"

    waits = [f"Would wait: {preview.reason}"]
    if tenant_id in over_budget:
        admission = AdmissionAdvice("waits", preview.reason, {}, False, 0, _sentences(waits))
        start = StartAdvice(None, None, 0, 0, ("No start time: nothing of the tenant's starts past its hard budget.",))
        return admission, start, {}, "none"
    forecast = forecast_starts(
        hypothetical,
        ends_at=_expected_ends(hypothetical, speeds),
        work=_work(hypothetical, spec, speeds),
        watch=(capacity.HYPOTHETICAL_JOB,),
        blend=settings.POLYCHIP_FAIR_SHARE_BLEND,
        policy=placement_policy(),
    )
    started = forecast.starts.get(capacity.HYPOTHETICAL_JOB)
    placement = dict(Counter(d.flavor for d in forecast.placements.get(capacity.HYPOTHETICAL_JOB, ())))
    if started is not None:
        waits.append(f"It should start on {_devices_words(placement)} once the jobs ahead of it have made room")
    admission = AdmissionAdvice("waits", preview.reason, {}, False, 0, _sentences(waits))
    return admission, _start(forecast, started, now), dict(sorted(placement.items())), "estimated start"


def _start(forecast: Forecast, started: float | None, now: datetime) -> StartAdvice:
    if started is None:
        if forecast.cut_short:
            why = (
                f"the queue is too deep to play forward at submit time: {forecast.cycles:,} scheduling cycles "
                f"reached {_duration(forecast.until - now.timestamp())} ahead without starting it"
            )
        elif forecast.endless:
            why = (
                f"{len(forecast.endless)} job(s) holding devices have no end estimate (no measured speed, and no "
                "throughput figure for their class), and those that do end do not free enough"
            )
        else:
            why = f"the queue played forward does not reach it within {_duration(forecast.until - now.timestamp())}"
        return StartAdvice(None, None, forecast.ended, max(0, forecast.admitted), (f"No start estimate: {why}.",))
    wait_s = max(0.0, started - now.timestamp())
    at = now + timedelta(seconds=wait_s)
    others = max(0, forecast.admitted - 1)
    sentences = [
        f"Expected start: in about {_duration(wait_s)}, around {at:%Y-%m-%d %H:%M} UTC, after {forecast.ended} "
        f"job(s) end and {others} other waiting job(s) start before it or with it",
        "An estimate: the queue is played forward by the scheduler, each job ending at its steps left and "
        "speed; jobs submitted later, failures and cancellations are not foreseen",
    ]
    return StartAdvice(at, wait_s, forecast.ended, others, _sentences(sentences))


def _expected_ends(snapshot: Snapshot, speeds: _Speeds) -> dict[int, float | None]:
    """When each holding job should end: its steps left at its measured speed, else at the table's
    speed on the devices it holds (None: neither is known)."""
    holding = {job.job_id: job for job in snapshot.admitted}
    ends: dict[int, float | None] = {}
    for pk, state, measured, steps_done, total_steps, batch, job_class in _progress(holding):
        samples_left = max(0, total_steps - steps_done) * batch
        rate = measured if state == JobState.RUNNING and measured else None
        rate = rate or speeds.of_gang(job_class, Counter(d.flavor for d in holding[pk].devices))
        ends[pk] = snapshot.now + samples_left / rate if rate else None
    return ends


def _work(snapshot: Snapshot, spec: JobSpec, speeds: _Speeds) -> dict[int, Work]:
    """What each waiting job has left to train, and at what speed per device of each flavor it allows."""
    waiting: dict[int, PendingJob] = {job.job_id: job for job in snapshot.pending}

    def per_device(job: PendingJob) -> dict[str, float]:
        rates = {flavor: speeds.per_device(job.job_class, flavor, job.devices) for flavor in job.flavors}
        return {flavor: rate for flavor, rate in rates.items() if rate}

    work = {
        pk: Work(max(0, total_steps - steps_done) * batch, per_device(waiting[pk]))
        for pk, _, _, steps_done, total_steps, batch, _ in _progress(waiting)
    }
    asked = waiting.get(capacity.HYPOTHETICAL_JOB)
    if asked is not None:
        work[asked.job_id] = Work(spec.workload.steps * spec.workload.global_batch, per_device(asked))
    return work


def _progress(jobs: Mapping[int, AdmittedJob] | Mapping[int, PendingJob]) -> list[tuple[Any, ...]]:
    """(id, state, measured samples/s, steps done, total steps, global batch, class) of stored jobs."""
    rows = TrainingJob.objects.filter(pk__in=list(jobs)).values_list(
        "pk", "state", "samples_per_s", "steps_done", "total_steps", "spec__workload__global_batch", "job_class"
    )
    default_batch = WorkloadSpec().global_batch
    return [(*row[:5], int(row[5] or default_batch), row[6]) for row in rows]


# --- batch -----------------------------------------------------------------------------------------


def _batch(
    spec: JobSpec, flavors: Mapping[str, Flavor], placement: Mapping[str, int], where: str, table: ThroughputTable
) -> BatchAdvice:
    workload = spec.workload
    unknown = tuple(
        FlavorBatchAdvice(name, flavors[name].memory_gib, None, placement.get(name, 0), None)
        for name in spec.flavors
        if name in flavors
    )
    if workload.kind != "builtin":
        sentence = (
            f"Micro-batches unknown: {_BUILTIN_ONLY}; the ranks of {workload.kind} code are not capped, so each step "
            f"trains the global batch of {workload.global_batch:,} in one micro-step split by speed: check that "
            "a device's share fits in its memory"
        )
        return BatchAdvice(workload.global_batch, where, None, None, None, unknown, (sentence + ".",))
    params, activation_bytes = memory_figures(workload.model, workload.hidden)
    caps: dict[str, int | None] = {}
    for name, flavor in flavors.items():
        try:
            caps[name] = max_micro_batch(
                flavor.memory_gib * 2**30,
                param_count=params,
                activation_bytes_per_sample=activation_bytes,
                budget=MEMORY_BUDGET,
            )
        except BalancingError:
            caps[name] = None
    model = (
        f"{workload.model} (hidden {workload.hidden}) has {params:,} parameters and keeps "
        f"{_bytes(activation_bytes)} of activations per sample"
    )
    fits = ", ".join(
        f"{name} ({flavors[name].memory_gib:g} GiB) {caps[name]:,}" if caps.get(name) else f"{name}: not one sample"
        for name in spec.flavors
        if name in flavors
    )
    sentences = [
        f"{model}: in {MEMORY_BUDGET:.0%} of a device's memory, after 16 bytes of state per parameter, one device "
        f"takes at most {fits} samples per micro-step"
    ]
    ranks = [name for name, count in sorted(placement.items()) for _ in range(count)]
    accumulation: int | None = None
    largest: dict[str, int] = {}
    if ranks and all(caps.get(name) for name in ranks):
        weights = _balancing_weights(spec, workload.job_class, ranks, flavors, table)
        split = proportional_split(workload.global_batch, weights, [caps[name] for name in ranks])
        accumulation = split.accumulation
        for rank, name in enumerate(ranks):
            largest[name] = max(largest.get(name, 0), max(chunk[rank] for chunk in split.chunks))
        shares = ", ".join(f"{largest[name]:,} per {name}" for name in sorted(largest))
        steps = "one micro-step (no accumulation)" if accumulation == 1 else f"{accumulation} accumulation micro-steps"
        sentences.insert(
            0,
            f"On {_devices_words(placement)} ({where}), the global batch of {workload.global_batch:,} runs as "
            f"{shares} in {steps}",
        )
    elif ranks:
        short = sorted({name for name in ranks if not caps.get(name)})
        sentences.insert(0, f"It cannot train on {', '.join(short)}: not one sample fits beside the model's state")
    advice = tuple(
        FlavorBatchAdvice(name, flavors[name].memory_gib, caps.get(name), placement.get(name, 0), largest.get(name))
        for name in spec.flavors
        if name in flavors
    )
    return BatchAdvice(
        workload.global_batch, where, params, activation_bytes, accumulation, advice, _sentences(sentences)
    )


def _balancing_weights(
    spec: JobSpec, job_class: str, ranks: Sequence[str], flavors: Mapping[str, Flavor], table: ThroughputTable
) -> list[float]:
    """The first split's weights, as the launch gives them (``lifecycle``): equal for ``balancing: equal``,
    else the table's measured per-device speeds when every flavor has one, else peak bf16 TFLOP/s."""
    if spec.balancing.mode == "equal":
        return [1.0] * len(ranks)
    measured = table.measured_per_device()
    if all(measured.get((job_class, name)) for name in ranks):
        return [measured[(job_class, name)] for name in ranks]
    return [flavors[name].peak_bf16_tflops for name in ranks]


# --- checkpoints -----------------------------------------------------------------------------------


def _checkpoint(
    tenant_id: int, spec: JobSpec, step_time_s: float | None, placement: Mapping[str, int]
) -> CheckpointAdvice:
    asked = spec.checkpoint
    spec_says = f"weights every {asked.weights_every:,} steps and optimizer state every {asked.optimizer_every:,}"
    save_cost_s, saves_seen = _measured_save_cost_s(tenant_id, spec.workload.job_class)
    missing = []
    if step_time_s is None:
        missing.append(
            f"no measured speed for {spec.workload.job_class} on {_devices_words(placement) or 'its flavors'}"
        )
    if save_cost_s is None:
        missing.append(f"no job of class {spec.workload.job_class} has reported what a save costs yet")
    if step_time_s is None or save_cost_s is None:
        return CheckpointAdvice(
            weights_every=None,
            optimizer_every=None,
            young_s=None,
            daly_s=None,
            mtbf_s=None,
            save_cost_s=save_cost_s,
            step_time_s=step_time_s,
            spec_weights_every=asked.weights_every,
            spec_optimizer_every=asked.optimizer_every,
            reasoning=_sentences(
                [
                    f"Checkpoint intervals unknown: {'; '.join(missing)}; the spec's {spec_says} stand",
                    "The job's own page shows Young's and Daly's intervals once it has saved a checkpoint",
                ]
            ),
        )
    rate, rate_source = pool_failure_rate()
    mtbf_s = job_mtbf_s(spec.devices, rate)
    interval = advise_intervals(save_cost_s, mtbf_s, step_time_s)
    headline = (
        f"Checkpoints: weights every {interval.weights_every:,} steps and optimizer state every "
        f"{interval.optimizer_every:,} (Young/Daly; the spec says {spec_says})"
    )
    basis = (
        f"The save cost is the median of {saves_seen} recent job(s) of the class; the failure rate is {rate_source}; "
        f"a step takes about {step_time_s:.3g} s on the placement"
    )
    return CheckpointAdvice(
        weights_every=interval.weights_every,
        optimizer_every=interval.optimizer_every,
        young_s=interval.young_s,
        daly_s=interval.daly_s,
        mtbf_s=mtbf_s,
        save_cost_s=save_cost_s,
        step_time_s=step_time_s,
        spec_weights_every=asked.weights_every,
        spec_optimizer_every=asked.optimizer_every,
        reasoning=(*_sentences([headline, basis]), interval.reasoning),
    )


def _measured_save_cost_s(tenant_id: int, job_class: str) -> tuple[float | None, int]:
    """The median stall of a save over the recent jobs of ``job_class`` that reported saves, and how many.
    A built-in model's saves are the same code whoever ran it; user code's class is the tenant's own, and
    only its own jobs are read (another tenant's jobs, even their count, are not its to see)."""
    jobs = TrainingJob.objects.filter(job_class=job_class, recovery__has_key="checkpoints")
    if job_class not in BUILTIN_MODELS:
        jobs = jobs.filter(tenant_id=tenant_id)
    recent = jobs.order_by("-pk").values_list("recovery", flat=True)[:RECENT_JOBS]
    stalls = [
        saves["stall_ms_sum"] / saves["count"] / 1000.0
        for recovery in recent
        if (saves := recovery.get("checkpoints") or {}).get("count")
    ]
    return (max(statistics.median(stalls), 1e-6), len(stalls)) if stalls else (None, 0)


# --- gradient exchange -----------------------------------------------------------------------------


def _comm(spec: JobSpec, flavors: Mapping[str, Flavor], placement: Mapping[str, int]) -> CommAdvice:
    requested = spec.comm.compression

    def note(choice: str) -> str:
        if requested in ("auto", choice):
            return ""
        return f" (the spec asks for {requested}; set comm.compression: auto to get {choice})"

    vendors = [flavors[name].vendor for name, count in sorted(placement.items()) for _ in range(count)]
    groups = len(set(vendors))
    if not placement:
        sentence = "Gradient exchange: no placement, so no cross-group link to judge"
        return CommAdvice(requested, None, None, None, 0, None, "none", (sentence + ".",))
    if groups < 2:
        sentence = (
            f"Gradient exchange: {_devices_words(placement)} form one vendor group, with no cross-group link; "
            f"auto would send gradients uncompressed (none){note('none')}"
        )
        return CommAdvice(requested, "none", spec.comm.density, spec.comm.rank, groups, None, "none", (sentence + ".",))
    link_gbit, link_source = _cross_group_link_gbit()
    workload = spec.workload
    if workload.kind != "builtin":
        sentence = (
            f"Gradient exchange unknown: {_BUILTIN_ONLY}, so the size of the gradients that cross the link between "
            f"{groups} vendor groups (cross-group link {link_source} at {link_gbit:g} Gbit/s) is not known; auto "
            "sizes them when the job starts"
        )
        return CommAdvice(requested, None, None, None, groups, link_gbit, link_source, (sentence + ".",))
    shapes = param_shapes(workload.model, workload.hidden)
    matrix, lowrank = lowrank_numbers(shapes, spec.comm.rank)
    choice = choose_policy(
        link_gbit * 1e9 / 8,
        sum(math.prod(shape) for shape in shapes),
        matrix_params=matrix,
        lowrank_params=lowrank,
        members=exchange_members([vendors.index(v) for v in vendors], spec.comm.hierarchical),
        density=spec.comm.density,
        rank=spec.comm.rank,
        link_source=link_source,
    )
    sentences = [
        f"Gradient exchange: auto would choose {choice.compression} between the {groups} vendor groups of "
        f"{_devices_words(placement)}{note(choice.compression)}",
        f"{choice.reason[0].upper()}{choice.reason[1:]}",
    ]
    return CommAdvice(
        requested,
        choice.compression,
        choice.density,
        choice.rank,
        groups,
        link_gbit,
        link_source,
        _sentences(sentences),
    )


def _cross_group_link_gbit() -> tuple[float, str]:
    """The cross-group link's speed in Gbit/s and where the figure comes from: the median that recent jobs
    across vendor groups measured; else the local backend's emulated link; else the topology model's
    assumption (``runtime.inventory.steptime.LinkModel``)."""
    recent = (
        TrainingJob.objects.filter(comm_stats__ran__link_gbit_measured__isnull=False)
        .order_by("-pk")
        .values_list("comm_stats__ran__link_gbit_measured", flat=True)[:RECENT_JOBS]
    )
    measured = [float(gbit) for gbit in recent if isinstance(gbit, int | float) and gbit > 0]
    if measured:
        gbit = statistics.median(measured)
        return gbit, f"measured by {len(measured)} recent job(s)"
    emulated = settings.POLYCHIP_LOCAL_LINK_GBIT if settings.POLYCHIP_BACKEND == "local" else None
    if emulated:
        return float(emulated), "emulated by the local backend (POLYCHIP_LOCAL_LINK_GBIT)"
    return LinkModel().inter_node_gbps * 8, "assumed (one 400 Gb/s NIC per device, until a job measures it)"


# --- cost ------------------------------------------------------------------------------------------


def _cost(tenant_id: int, spec: JobSpec, placement: Mapping[str, int], where: str) -> CostAdvice:
    job_class = spec.workload.job_class
    rates = throughput_matrix().rates({job_class})
    milli = {flavor: rates.get((job_class, flavor), MILLI) for flavor in spec.flavors}
    per_device = {flavor: milli[flavor] / MILLI for flavor in spec.flavors}
    currency = billing.price_book_for(tenant_id).currency
    each = ", ".join(f"{flavor} {nau:.3f} NAU" for flavor, nau in per_device.items())
    if not placement:
        sentence = f"No charge: it never starts (a device would count {each})"
        return CostAdvice(None, per_device, None, currency, (sentence + ".",))
    nau = sum(count * milli[flavor] for flavor, count in placement.items()) / MILLI
    try:
        per_hour = billing.hourly_cost(
            tenant_id=tenant_id, devices={flavor: (count, milli[flavor]) for flavor, count in placement.items()}
        )
    except billing.RatingError as exc:
        headline = (
            f"Charges {nau:.3f} NAU against the NAU quota on {_devices_words(placement)} ({where}); no price: {exc}"
        )
        return CostAdvice(nau, per_device, None, currency, _sentences([headline, f"NAU per device: {each}"]))
    headline = (
        f"Charges {nau:.3f} NAU against the NAU quota and costs {per_hour} {currency} an hour at your prices, "
        f"on {_devices_words(placement)} ({where})"
    )
    return CostAdvice(nau, per_device, per_hour, currency, _sentences([headline, f"NAU per device: {each}"]))


# --- words -----------------------------------------------------------------------------------------


def _sentences(parts: Sequence[str]) -> tuple[str, ...]:
    return tuple(part if part.endswith(".") else f"{part}." for part in parts)


def _devices_words(devices: Mapping[str, int]) -> str:
    """``2 h100-sxm`` or ``2 h100-sxm and 1 tpu-v4``."""
    parts = [f"{count} {flavor}" for flavor, count in sorted(devices.items()) if count]
    return " and ".join(parts)


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{seconds / 86400:.1f} days"


def _bytes(count: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count:.0f} bytes"
