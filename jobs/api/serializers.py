"""Plain-dict serializers of the jobs contracts (the API is read-through, never a ModelSerializer)."""

from __future__ import annotations

from typing import Any

from jobs.contracts import EventView, FlavorPoolView, JobView


def _time(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def job_json(job: JobView) -> dict[str, Any]:
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state,
        "pending_reason": job.pending_reason,
        "failure_reason": job.failure_reason,
        "spec": job.spec,
        "created_at": _time(job.created_at),
        "admitted_at": _time(job.admitted_at),
        "started_at": _time(job.started_at),
        "finished_at": _time(job.finished_at),
        "progress": {
            "steps_done": job.steps_done,
            "total_steps": job.total_steps,
            "fraction": round(job.progress, 4),
            "samples_per_s": job.samples_per_s,
        },
        "loss": {"first": job.first_loss, "last": job.last_loss, "recent": list(job.recent_losses)},
        "devices": [
            {
                "rank": d.rank,
                "device_id": d.device_id,
                "flavor": d.flavor,
                "node": d.node,
                "started_at": _time(d.started_at),
                "ended_at": _time(d.ended_at),
                "telemetry": job.rank_stats.get(str(d.rank), {}),
            }
            for d in job.devices
        ],
        "artifact": job.artifact_path or None,
    }


def event_json(event: EventView) -> dict[str, Any]:
    return {
        "id": event.id,
        "job": event.job_id,
        "kind": event.kind,
        "from_state": event.from_state,
        "to_state": event.to_state,
        "message": event.message,
        "data": event.data,
        "created_at": _time(event.created_at),
    }


def flavor_pool_json(row: FlavorPoolView) -> dict[str, Any]:
    return {
        "flavor": row.flavor,
        "vendor": row.vendor,
        "kind": row.kind,
        "model": row.model,
        "peak_bf16_tflops": row.peak_bf16_tflops,
        "memory_gib": row.memory_gib,
        "interconnect": row.interconnect,
        "devices": {"total": row.devices, "healthy": row.healthy, "allocated": row.allocated},
    }
