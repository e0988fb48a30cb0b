"""Scheduling: pure decisions over dataclasses (no Django, no I/O, no clock of its own).

- ``placement``: gang placement of devices within chosen flavors.
- ``model``: the scheduler's inputs and outputs.
- ``quota``: quota arithmetic over tenants and cohorts (nominal, borrowing, lending).
- ``fairshare``: dominant share with decayed historical usage.
- ``scheduler``: one admission cycle (queue manager, fit, preemption, reasons).
"""

from runtime.scheduling.fairshare import UsageInterval, decayed_usage, dominant_share
from runtime.scheduling.model import (
    MILLI,
    NAU,
    Admission,
    AdmittedJob,
    CycleResult,
    Limit,
    PendingJob,
    Preemption,
    Snapshot,
    TenantQuota,
    Waiting,
)
from runtime.scheduling.placement import (
    FreeDevice,
    FreePool,
    GangRequest,
    NodeDistance,
    Placement,
    Refusal,
    choose_devices,
    place_gang,
)
from runtime.scheduling.quota import QuotaLedger, demand_for
from runtime.scheduling.scheduler import schedule

__all__ = [
    "MILLI",
    "NAU",
    "Admission",
    "AdmittedJob",
    "CycleResult",
    "FreeDevice",
    "FreePool",
    "GangRequest",
    "Limit",
    "NodeDistance",
    "PendingJob",
    "Placement",
    "Preemption",
    "QuotaLedger",
    "Refusal",
    "Snapshot",
    "TenantQuota",
    "UsageInterval",
    "Waiting",
    "choose_devices",
    "decayed_usage",
    "demand_for",
    "dominant_share",
    "place_gang",
    "schedule",
]
