"""Worker telemetry, checked before it touches a job: pure parsing, no database.

The worker side of the schema is ``runtime.worker.telemetry``. Unknown kinds are ignored (a newer
worker may send more); known ones must have the types below, or the batch is refused whole with
the field that is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from runtime.errors import FieldError

KNOWN_KINDS = frozenset({"started", "heartbeat", "step", "finished", "failed"})


class InvalidTelemetry(FieldError):
    """A telemetry batch that cannot be applied."""


@dataclass(frozen=True)
class TelemetryEvent:
    kind: str
    rank: int
    ts: float
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    samples: int | None = None
    samples_per_s: float | None = None
    step_time_s: float | None = None
    flavor: str = ""
    device_id: str = ""
    artifact: str = ""


def _number(event: dict[str, Any], key: str, where: str, *, whole: bool = False) -> Any:
    value = event.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidTelemetry(f"{where}.{key}", "must be a finite number")
    if value < 0:
        raise InvalidTelemetry(f"{where}.{key}", "must not be negative")
    if whole:
        if not isinstance(value, int):
            raise InvalidTelemetry(f"{where}.{key}", "must be a whole number")
        return value
    return float(value)


def parse_events(raw: Any) -> list[TelemetryEvent]:
    if not isinstance(raw, list):
        raise InvalidTelemetry("events", 'send {"events": [{...}, ...]}')
    events: list[TelemetryEvent] = []
    for i, event in enumerate(raw):
        where = f"events[{i}]"
        if not isinstance(event, dict):
            raise InvalidTelemetry(where, "each event must be an object")
        kind = event.get("kind")
        if kind not in KNOWN_KINDS:
            continue
        rank = _number(event, "rank", where, whole=True)
        ts = _number(event, "ts", where)
        if rank is None or ts is None:
            raise InvalidTelemetry(f"{where}.{'rank' if rank is None else 'ts'}", "required")
        step = _number(event, "step", where, whole=True)
        if kind == "step" and (step is None or step < 1):
            raise InvalidTelemetry(f"{where}.step", "a step event needs its step number, from 1")
        events.append(
            TelemetryEvent(
                kind=kind,
                rank=rank,
                ts=ts,
                step=step,
                total_steps=_number(event, "total_steps", where, whole=True),
                loss=_number(event, "loss", where),
                samples=_number(event, "samples", where, whole=True),
                samples_per_s=_number(event, "samples_per_s", where),
                step_time_s=_number(event, "step_time_s", where),
                flavor=str(event.get("flavor", ""))[:63],
                device_id=str(event.get("device_id", ""))[:200],
                artifact=str(event.get("artifact", ""))[:500],
            )
        )
    return events
