"""Worker telemetry, checked before it touches a job: pure parsing, no database.

The worker side of the schema is ``runtime.worker.telemetry``. Unknown kinds are ignored (a newer
worker may send more); known ones must have the types below, or the batch is refused whole with
the field that is wrong.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from controlplane.domain import Invalid
from runtime.recovery.health import FEATURES

KNOWN_KINDS = frozenset(
    {
        "started",
        "heartbeat",
        "step",
        "finished",
        "failed",
        "rebalanced",
        "straggler",
        "comm",
        "comm_summary",
        "checkpoint",
        "restored",
        "resumed",
        "stopped",
        "metrics",
    }
)


class InvalidTelemetry(Invalid):
    """A telemetry batch that cannot be applied (HTTP 400, naming the field at fault)."""

    code = "invalid_telemetry"

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message, field=field)


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
    # Communication (``runtime.comm``), checked by ``_comm``: a "comm" event's policy that ran and why,
    # its vendor groups and link; a step event's bytes and collective times; a "comm_summary" event's
    # per-step averages over the run. None when the event carries none of it.
    comm: dict[str, Any] | None = None
    # Recovery (``runtime.worker.checkpointing``), checked by ``_recovery``: a "checkpoint" event's
    # step, kind, stall and write times and size; a "restored" event's steps, mode and the checkpoints
    # it skipped; a "resumed" event's first step after the restore.
    recovery: dict[str, Any] | None = None
    # A heartbeat's device health rows since the last one (``runtime.recovery.health.FEATURES``).
    device_readings: tuple[tuple[float, ...], ...] | None = None
    # Named scalars the training code reported (``_metrics``): on a step event next to its loss, or on a
    # "metrics" event for values reported off the step (an evaluation). Rank 0's are stored (jobs.metrics).
    metrics: tuple[tuple[str, float], ...] | None = None
    # Where the event was in the batch ("events[3]"), for an error found after parsing.
    where: str = ""


# Whole numbers land in 32-bit columns (steps, ranks); byte counts stay in JSON and may be larger.
MAX_WHOLE = 2**31 - 1
MAX_BYTES = 2**53
# No figure in a worker's telemetry is larger than this (rates are also checked per flavor, at ingest).
MAX_FIGURE = 1e15


def _number(event: dict[str, Any], key: str, where: str, *, whole: bool = False, maximum: float | None = None) -> Any:
    value = event.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidTelemetry(f"{where}.{key}", "must be a finite number")
    if value < 0:
        raise InvalidTelemetry(f"{where}.{key}", "must not be negative")
    limit = maximum if maximum is not None else MAX_WHOLE if whole else MAX_FIGURE
    if value > limit:
        raise InvalidTelemetry(f"{where}.{key}", f"must be at most {limit:g}")
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


def _flag(event: dict[str, Any], key: str, where: str) -> bool | None:
    value = event.get(key)
    if value is not None and not isinstance(value, bool):
        raise InvalidTelemetry(f"{where}.{key}", "must be true or false")
    return value


def _groups(event: dict[str, Any], key: str, where: str) -> list[list[int]] | None:
    value = event.get(key)
    if value is None:
        return None
    if (
        not isinstance(value, list)
        or len(value) > MAX_RANKS
        or not all(
            isinstance(group, list)
            and len(group) <= MAX_RANKS
            and all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in group)
            for group in value
        )
    ):
        raise InvalidTelemetry(f"{where}.{key}", "must be a list of groups, each a list of ranks (>= 0)")
    return [list(group) for group in value]


def _link(event: dict[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = event.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidTelemetry(f"{where}.{key}", 'must be an object such as {"mode": "token_bucket", "gbit": 1.0}')
    return {"mode": str(value.get("mode", "none"))[:20], "gbit": _number(value, "gbit", f"{where}.{key}")}


# What each kind may carry about communication, and how each field is checked.
_COMM_STEP = ("comm_bytes_intra", "comm_bytes_cross", "collective_s", "exposed_s", "hidden_share")
_COMM_SUMMARY = (
    "bytes_intra_per_step",
    "bytes_cross_per_step",
    "collective_s_per_step",
    "exposed_s_per_step",
    "hidden_share",
)


def _comm(event: dict[str, Any], kind: str, where: str) -> dict[str, Any] | None:
    if kind == "comm":
        return {
            "policy": str(event.get("policy", ""))[:120],
            "compression": str(event.get("compression", ""))[:20],
            "reason": str(event.get("reason", ""))[:600],
            "hierarchical": _flag(event, "hierarchical", where),
            "groups": _groups(event, "groups", where),
            "buckets": _number(event, "buckets", where, whole=True),
            "overlap": _flag(event, "overlap", where),
            "link": _link(event, "link", where),
            "link_gbit_measured": _number(event, "link_gbit_measured", where),
        }
    if kind == "step":
        figures = {
            key: _number(event, key, where, whole=True, maximum=MAX_BYTES)
            if key.startswith("comm_bytes")
            else _number(event, key, where)
            for key in _COMM_STEP
        }
        return figures if any(v is not None for v in figures.values()) else None
    if kind == "comm_summary":
        return {
            "steps": _number(event, "steps", where, whole=True),
            **{key: _number(event, key, where) for key in _COMM_SUMMARY},
        }
    return None


def _recovery(event: dict[str, Any], kind: str, where: str) -> dict[str, Any] | None:
    if kind == "checkpoint":
        return {
            "step": _number(event, "step", where, whole=True),
            "checkpoint_kind": str(event.get("checkpoint_kind", ""))[:20],
            "stall_ms": _number(event, "stall_ms", where),
            "write_ms": _number(event, "write_ms", where),
            "bytes": _number(event, "bytes", where, whole=True, maximum=MAX_BYTES),
            "background": _flag(event, "background", where),
        }
    if kind == "restored":
        skipped = event.get("skipped") or []
        if not isinstance(skipped, list):
            raise InvalidTelemetry(f"{where}.skipped", "must be a list of {checkpoint, reason} objects")
        return {
            "step": _number(event, "step", where, whole=True),
            "optimizer_step": _number(event, "optimizer_step", where, whole=True),
            "mode": str(event.get("mode", ""))[:20],
            "world_size": _number(event, "world_size", where, whole=True),
            "saved_world_size": _number(event, "saved_world_size", where, whole=True),
            "restore_s": _number(event, "restore_s", where),
            "skipped": [
                {"checkpoint": str(s.get("checkpoint", ""))[:60], "reason": str(s.get("reason", ""))[:200]}
                for s in skipped[:20]
                if isinstance(s, dict)
            ],
        }
    if kind == "resumed":
        return {
            "step": _number(event, "step", where, whole=True),
            "restored_step": _number(event, "restored_step", where, whole=True),
            "restore_s": _number(event, "restore_s", where),
        }
    return None


MAX_READINGS = 120


def _readings(event: dict[str, Any], where: str) -> tuple[tuple[float, ...], ...] | None:
    value = event.get("device_readings")
    if value is None:
        return None
    width = len(FEATURES)
    if (
        not isinstance(value, list)
        or len(value) > MAX_READINGS
        or not all(
            isinstance(row, list)
            and len(row) == width
            and all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in row)
            for row in value
        )
    ):
        raise InvalidTelemetry(
            f"{where}.device_readings", f"must be a list of rows of {width} finite numbers ({', '.join(FEATURES)})"
        )
    return tuple(tuple(float(v) for v in row) for row in value)


METRIC_NAME = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")
MAX_METRICS = 32
# A reported scalar's magnitude: far above any loss, accuracy or perplexity, and low enough that a chart
# bucket's sum over millions of steps stays a finite double (PostgreSQL's AVG raises on overflow).
MAX_METRIC = 1e100


def _metrics(event: dict[str, Any], where: str, *, required: bool) -> tuple[tuple[str, float], ...] | None:
    value = event.get("metrics")
    field = f"{where}.metrics"
    if value is None:
        if required:
            raise InvalidTelemetry(field, 'a metrics event needs its values: {"name": number, ...}')
        return None
    if not isinstance(value, dict):
        raise InvalidTelemetry(field, 'must be an object of name -> number, such as {"accuracy": 0.93}')
    if len(value) > MAX_METRICS:
        raise InvalidTelemetry(field, f"at most {MAX_METRICS} metrics an event, got {len(value)}")
    out: list[tuple[str, float]] = []
    for name, number in value.items():
        if not isinstance(name, str) or not METRIC_NAME.fullmatch(name):
            raise InvalidTelemetry(
                field, f"metric name {str(name)[:80]!r} must be 1-64 letters, digits or any of _ . : / -"
            )
        if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
            raise InvalidTelemetry(f"{field}.{name}", "must be a finite number")
        if abs(number) > MAX_METRIC:
            raise InvalidTelemetry(f"{field}.{name}", f"must be between -{MAX_METRIC:g} and {MAX_METRIC:g}")
        out.append((name, float(number)))
    return tuple(out)


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
        if kind == "metrics" and step is None:
            raise InvalidTelemetry(f"{where}.step", "a metrics event needs the step its values belong to")
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
                comm=_comm(event, kind, where),
                recovery=_recovery(event, kind, where),
                device_readings=_readings(event, where) if kind == "heartbeat" else None,
                metrics=_metrics(event, where, required=kind == "metrics") if kind in ("step", "metrics") else None,
                where=where,
            )
        )
    return events
