"""Scheduling: pure decisions over dataclasses (no Django, no I/O, no clock of its own).

- ``placement``: gang placement of devices within chosen flavors.
- ``model``: the scheduler's inputs and outputs.
- ``quota``: quota arithmetic over tenants and cohorts (nominal, borrowing, lending).
- ``fairshare``: dominant share with decayed historical usage.
- ``scheduler``: one admission cycle (queue manager, fit, preemption, reasons).
"""

from runtime.scheduling.placement import FreeDevice, GangRequest, Placement, Refusal, place_gang

__all__ = ["FreeDevice", "GangRequest", "Placement", "Refusal", "place_gang"]
