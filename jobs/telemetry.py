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

KNOWN_KINDS = frozenset({"started", "heartbeat", "step", "finished", "failed", "rebalanced", "straggler"})


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
    # Balancing (``runtime.worker.train``): rank 0's step events carry the split of that step (chunks
    # of per-rank samples), the predicted per-rank samples/s and the split's balance efficiency, and
    # the gang's samples/s; "rebalanced" events the new split; "straggler" events the slow rank.
    chunks: int | None = None
    split: tuple[tuple[int, ...], ...] | None = None
    predicted: tuple[float, ...] | None = None
    efficiency: float | None = None
    global_samples_per_s: float | None = None
    reason: str = ""
    steps_since_drift: int | None = None
    straggler_rank: int | None = None
    measured_samples_per_s: float | None = None
    expected_samples_per_s: float | None = None


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


MAX_RANKS = 4096


def _split(event: dict[str, Any], key: str, where: str) -> tuple[tuple[int, ...], ...] | None:
    value = event.get(key)
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or not value
        or len(value) > MAX_RANKS
        or not all(
            isinstance(chunk, list)
            and 0 < len(chunk) <= MAX_RANKS
            and all(isinstance(b, int) and not isinstance(b, bool) and b >= 0 for b in chunk)
            for chunk in value
        )
        or len({len(chunk) for chunk in value}) != 1
    ):
        raise InvalidTelemetry(f"{where}.{key}", "must be a list of chunks, each a list of samples per rank (>= 0)")
    return tuple(tuple(chunk) for chunk in value)


def _numbers(event: dict[str, Any], key: str, where: str) -> tuple[float, ...] | None:
    value = event.get(key)
    if value is None:
        return None
    if not isinstance(value, list) or len(value) > MAX_RANKS:
        raise InvalidTelemetry(f"{where}.{key}", "must be a list of numbers, one per rank")
    return tuple(_number({key: v}, key, where) for v in value)


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
                chunks=_number(event, "chunks", where, whole=True),
                split=_split(event, "split" if kind == "step" else "new_split", where),
                predicted=_numbers(event, "predicted", where),
                efficiency=_number(event, "efficiency", where),
                global_samples_per_s=_number(event, "global_samples_per_s", where),
                reason=str(event.get("reason", ""))[:300],
                steps_since_drift=_number(event, "steps_since_drift", where, whole=True),
                straggler_rank=_number(event, "straggler_rank", where, whole=True),
                measured_samples_per_s=_number(event, "measured_samples_per_s", where),
                expected_samples_per_s=_number(event, "expected_samples_per_s", where),
            )
        )
    return events
