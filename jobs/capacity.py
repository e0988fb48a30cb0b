"""Whether a job could ever start: the check at submit that keeps a job from waiting forever.

A job is asked to wait only for what will come: devices that others hold now, quota that others
borrow now. If it could not start even on an idle pool, with every device of the pool in service
and no other work anywhere, it never will (until an operator adds devices or quota), so submit
refuses it with the reason (400, ``devices``), unless its spec says ``wait_for_capacity: true``.

The question is put to the scheduler itself rather than answered by a formula beside it: one
admission cycle of this job alone, on the whole pool free, under its tenant's quotas and its
cohort's lending. Whatever admission would refuse there (a gang larger than the flavors' devices,
more than the quota and the cohort could ever give, the NAU a flavor costs) it refuses at submit, in
the same words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime

from django.conf import settings
from django.utils import timezone

from jobs.admission import over_hard_budget, placement_policy
from jobs.contracts import AdmissionPreview
from jobs.models import Device
from jobs.pool import scheduler_devices
from jobs.snapshot import load_snapshot, tenant_quotas
from jobs.throughput import throughput_matrix
from runtime.jobspec import JobSpec
from runtime.scheduling import schedule
from runtime.scheduling.model import MILLI, NAU, PendingJob, Snapshot

HYPOTHETICAL_JOB = 0  # the job id of the job asked about: no stored job has it


def _hypothetical(tenant_id: int, spec: JobSpec, submitted_at: float) -> PendingJob:
    return PendingJob(
        job_id=HYPOTHETICAL_JOB,
        tenant_id=tenant_id,
        priority=spec.priority,
        submitted_at=submitted_at,
        devices=spec.devices,
        flavors=spec.flavors,
        job_class=spec.workload.job_class,
        min_devices=spec.min_devices if spec.elastic else None,
    )


def _flavors_in_pool(counts: Counter[str], flavors: tuple[str, ...]) -> str:
    """What the pool has of the flavors: ``4 tpu-v4``, or ``2 h100-sxm and 2 a100-sxm (4 in all)``."""
    parts = [f"{counts[flavor]} {flavor}" for flavor in flavors]
    if len(parts) == 1:
        return parts[0]
    return f"{', '.join(parts[:-1])} and {parts[-1]} ({sum(counts[f] for f in flavors)} in all)"


def idle_pool_placement(*, tenant_id: int, spec: JobSpec) -> tuple[dict[str, int], str | None]:
    """Where the job would go on an idle pool, alone under its tenant's quotas (devices per flavor),
    and, when it could not start even there, why it never will (then no devices)."""
    every_device = scheduler_devices(Device.objects.all())
    in_pool = Counter(device.flavor for device in every_device if device.flavor in spec.flavors)
    fewest = (spec.min_devices or spec.devices) if spec.elastic else spec.devices  # an elastic job starts on its min
    if sum(in_pool.values()) < fewest:
        return {}, (
            f"the pool has {_flavors_in_pool(in_pool, spec.flavors)} and this job needs {fewest}, so it could "
            f"never start; ask for at most {sum(in_pool.values())}, allow more flavors, or set wait_for_capacity: true "
            "to wait for more devices"
        )
    job = _hypothetical(tenant_id, spec, 0.0)
    idle = Snapshot(
        now=timezone.now().timestamp(),
        tenants=tenant_quotas(),
        pending=[job],
        admitted=[],
        free=every_device,
        nau_rates=throughput_matrix().rates({spec.workload.job_class}),
    )
    result = schedule(idle)
    admitted = next((admission for admission in result.admissions if admission.job_id == HYPOTHETICAL_JOB), None)
    if admitted is not None:
        return dict(sorted(Counter(device.flavor for device in admitted.devices).items())), None
    why = next((waiting.reason for waiting in result.waiting if waiting.job_id == HYPOTHETICAL_JOB), "")
    return {}, (
        f"could never start, even with the whole pool idle: {why or 'admission refuses it'}; "
        "ask for fewer devices or other flavors, ask an operator for quota, or set wait_for_capacity: true"
    )


def never_fits(*, tenant_id: int, spec: JobSpec) -> str | None:
    """Why the job could not start even on an idle pool; None when it could."""
    return idle_pool_placement(tenant_id=tenant_id, spec=spec)[1]


def preview(*, tenant_id: int, spec: JobSpec) -> AdmissionPreview:
    """What the next admission cycle would do with this spec if it were submitted now (``preview_on``
    today's snapshot), or why it never could."""
    never = never_fits(tenant_id=tenant_id, spec=spec)
    if never is not None:
        rates = throughput_matrix().rates({spec.workload.job_class})
        per_device = {flavor: rates.get((spec.workload.job_class, flavor), MILLI) for flavor in spec.flavors}
        return AdmissionPreview(never, False, never, {}, 0.0, False, (), per_device)
    return preview_on(load_snapshot(timezone.now()), tenant_id=tenant_id, spec=spec)


def with_hypothetical(snapshot: Snapshot, *, tenant_id: int, spec: JobSpec) -> tuple[Snapshot, dict[int, str]]:
    """``snapshot`` as the next cycle would decide on it with the spec submitted now (``HYPOTHETICAL_JOB``,
    last in its priority), and the tenants past their hard budget with why: as in the cycle, their
    waiting jobs are left out."""
    rates = throughput_matrix().rates({spec.workload.job_class})
    job = _hypothetical(tenant_id, spec, snapshot.now)
    pending = [*snapshot.pending, job]
    over_budget = over_hard_budget(
        {p.tenant_id for p in pending}, datetime.fromtimestamp(snapshot.now, UTC), raise_alerts=False
    )
    pending = [p for p in pending if p.tenant_id not in over_budget]
    return replace(snapshot, pending=pending, nau_rates={**snapshot.nau_rates, **rates}), over_budget


def preview_on(snapshot: Snapshot, *, tenant_id: int, spec: JobSpec) -> AdmissionPreview:
    """What one cycle of the scheduler on ``snapshot`` (the queue, what runs, the free devices, every
    quota) would do with the job added last in its priority, decided and thrown away. Nothing is stored
    or locked, so a preview can disagree with the cycle that really comes if the pool changes in between."""
    snapshot, over_budget = with_hypothetical(snapshot, tenant_id=tenant_id, spec=spec)
    return preview_of(snapshot, over_budget, tenant_id=tenant_id, spec=spec)


def preview_of(
    snapshot: Snapshot, over_budget: Mapping[int, str], *, tenant_id: int, spec: JobSpec
) -> AdmissionPreview:
    """``preview_on`` for a snapshot that ``with_hypothetical`` already made (the advisor plays the
    same one forward, so the budgets are rated once)."""
    per_device = {flavor: snapshot.nau_rates.get((spec.workload.job_class, flavor), MILLI) for flavor in spec.flavors}
    if tenant_id in over_budget:
        return AdmissionPreview(None, False, over_budget[tenant_id], {}, 0.0, False, (), per_device)
    result = schedule(snapshot, blend=settings.POLYCHIP_FAIR_SHARE_BLEND, policy=placement_policy())
    admitted = next((a for a in result.admissions if a.job_id == HYPOTHETICAL_JOB), None)
    if admitted is None:
        why = next((w.reason for w in result.waiting if w.job_id == HYPOTHETICAL_JOB), "")
        return AdmissionPreview(None, False, why or "admission would not start it yet", {}, 0.0, False, (), per_device)
    devices = dict(sorted(Counter(device.flavor for device in admitted.devices).items()))
    keeps = {p.job_id: p.keep for p in result.preemptions if p.by_job_id == HYPOTHETICAL_JOB}
    making_room = [
        f"shrink elastic job {job_id} to {keeps[job_id]} devices" if keeps.get(job_id) else f"preempt job {job_id}"
        for job_id in admitted.preempts
    ]
    return AdmissionPreview(
        never=None,
        starts_now=not admitted.preempts,
        reason=f"would {' and '.join(making_room)} first" if making_room else "",
        devices=devices,
        nau=admitted.demand.get(NAU, 0) / MILLI,
        borrowing=admitted.borrowing,
        preempts=tuple(admitted.preempts),
        nau_milli_per_device=per_device,
    )
