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
from dataclasses import replace

from django.conf import settings
from django.utils import timezone

from jobs.admission import placement_policy
from jobs.contracts import AdmissionPreview
from jobs.models import Device
from jobs.pool import scheduler_devices
from jobs.snapshot import load_snapshot, tenant_quotas
from jobs.throughput import throughput_matrix
from runtime.jobspec import JobSpec
from runtime.scheduling import schedule
from runtime.scheduling.model import MILLI, NAU, PendingJob, Snapshot

_ALONE = 0  # the job id of the hypothetical job: no stored job has it


def _hypothetical(tenant_id: int, spec: JobSpec, submitted_at: float) -> PendingJob:
    return PendingJob(
        job_id=_ALONE,
        tenant_id=tenant_id,
        priority=spec.priority,
        submitted_at=submitted_at,
        devices=spec.devices,
        flavors=spec.flavors,
        job_class=spec.workload.job_class,
    )


def never_fits(*, tenant_id: int, spec: JobSpec) -> str | None:
    """Why the job could not start even on an idle pool; None when it could."""
    every_device = scheduler_devices(Device.objects.all())
    allowed = set(spec.flavors)
    in_pool = sum(1 for device in every_device if device.flavor in allowed)
    flavors = " or ".join(spec.flavors)
    if in_pool < spec.devices:
        return (
            f"needs {spec.devices} devices of {flavors} but the pool has {in_pool} in all, so it could never start; "
            f"ask for at most {in_pool}, allow more flavors, or set wait_for_capacity: true to wait for more devices"
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
    if any(admission.job_id == _ALONE for admission in result.admissions):
        return None
    why = next((waiting.reason for waiting in result.waiting if waiting.job_id == _ALONE), "")
    return (
        f"could never start, even with the whole pool idle: {why or 'admission refuses it'}; "
        "ask for fewer devices or other flavors, ask an operator for quota, or set wait_for_capacity: true"
    )


def preview(*, tenant_id: int, spec: JobSpec) -> AdmissionPreview:
    """What the next admission cycle would do with this spec if it were submitted now: one cycle of
    the scheduler on today's snapshot (the queue, what runs, the free devices, every quota) with the
    job added last in its priority, decided and thrown away. Nothing is stored or locked, so two
    previews can disagree with the cycle that really comes if the pool changes in between."""
    rates = throughput_matrix().rates({spec.workload.job_class})
    per_device = {flavor: rates.get((spec.workload.job_class, flavor), MILLI) for flavor in spec.flavors}
    never = never_fits(tenant_id=tenant_id, spec=spec)
    if never is not None:
        return AdmissionPreview(never, False, never, {}, 0.0, False, (), per_device)
    snapshot = load_snapshot(timezone.now())
    job = _hypothetical(tenant_id, spec, snapshot.now)
    snapshot = replace(snapshot, pending=[*snapshot.pending, job], nau_rates={**snapshot.nau_rates, **rates})
    result = schedule(snapshot, blend=settings.POLYCHIP_FAIR_SHARE_BLEND, policy=placement_policy())
    admitted = next((a for a in result.admissions if a.job_id == _ALONE), None)
    if admitted is None:
        why = next((w.reason for w in result.waiting if w.job_id == _ALONE), "") or "admission would not start it yet"
        return AdmissionPreview(None, False, why, {}, 0.0, False, (), per_device)
    devices = dict(sorted(Counter(device.flavor for device in admitted.devices).items()))
    return AdmissionPreview(
        never=None,
        starts_now=not admitted.preempts,
        reason=f"would preempt job(s) {', '.join(map(str, admitted.preempts))} first" if admitted.preempts else "",
        devices=devices,
        nau=admitted.demand.get(NAU, 0) / MILLI,
        borrowing=admitted.borrowing,
        preempts=tuple(admitted.preempts),
        nau_milli_per_device=per_device,
    )
