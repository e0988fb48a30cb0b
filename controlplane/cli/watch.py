"""Waiting for a job: long polls of the wait route, or (``--follow``) its state and progress on stderr.

The outcome is the exit code (``exitcodes.BY_STATE``; 101 when the time is up). Ctrl-C detaches: the
job goes on, and the message says how to come back to it.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from controlplane.cli import exitcodes
from controlplane.cli.api import Api
from controlplane.cli.output import Out

LONG_POLL_S = 55.0  # one wait request at most: under the usual proxy idle timeouts
FOLLOW_POLL_S = 1.0


def until_done(api: Api, out: Out, job_id: int, *, timeout_s: float, follow: bool, cancel: bool) -> int:
    try:
        job = _follow(api, out, job_id, timeout_s) if follow else _wait(api, job_id, timeout_s)
    except KeyboardInterrupt:
        out.say(
            f"\ndetached: job {job_id} goes on; come back to it with `polychip wait {job_id} --follow`, "
            f"or stop it with `polychip cancel {job_id}`"
        )
        return exitcodes.INTERRUPTED
    state = job["state"]
    if state in exitcodes.BY_STATE:
        why = f": {job['failure_reason']}" if job.get("failure_reason") else ""
        out.say(f"job {job_id} {state}{why}")
        _final(out, job)
        return exitcodes.BY_STATE[state]
    if cancel:
        job = api.cancel(job_id)
        out.say(f"job {job_id} was still {state} after {timeout_s:.0f} s: cancelled it (--cancel-on-timeout)")
    else:
        out.say(
            f"job {job_id} is still {state} after {timeout_s:.0f} s; it goes on: "
            f"`polychip wait {job_id}` waits again, `polychip cancel {job_id}` stops it"
        )
    _final(out, job)
    return exitcodes.NOT_FINISHED


def _final(out: Out, job: dict[str, Any]) -> None:
    from controlplane.cli.main import JOB_COLUMNS

    out.show(job, kind="job", columns=JOB_COLUMNS)


def _wait(api: Api, job_id: int, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = max(0.0, deadline - time.monotonic())
        job = api.wait(job_id, until=None, timeout_s=min(left, LONG_POLL_S))
        if job["wait"]["reached"] or time.monotonic() >= deadline:
            return job


def _follow(api: Api, out: Out, job_id: int, timeout_s: float) -> dict[str, Any]:
    """Poll the job, saying each change of state and showing its steps and loss."""
    deadline = time.monotonic() + timeout_s
    live = sys.stderr.isatty() and not out.quiet
    bar = _Bar() if live else None
    last_state, last_line = "", 0.0
    try:
        while True:
            job = api.job(job_id)
            if job["state"] != last_state:
                detail = job.get("pending_reason") or job.get("failure_reason") or ""
                message = f"[{time.strftime('%H:%M:%S')}] {job['state']}{': ' + detail if detail else ''}"
                if bar is not None:
                    bar.log(message)
                else:
                    out.say(message)
                last_state = job["state"]
            progress = job.get("progress") or {}
            if bar is not None:
                bar.update(job)
            elif progress.get("steps_done") and time.monotonic() - last_line >= 5:
                last_line = time.monotonic()
                loss = (job.get("loss") or {}).get("last")
                out.say(
                    f"  step {progress['steps_done']}/{progress.get('total_steps', 0)}"
                    + (f"  loss {loss:.4f}" if loss is not None else "")
                    + f"  {progress.get('samples_per_s') or 0:.0f} samples/s"
                )
            if job["state"] in exitcodes.BY_STATE or time.monotonic() >= deadline:
                return job
            time.sleep(FOLLOW_POLL_S)
    finally:
        if bar is not None:
            bar.stop()


class _Bar:
    """A rich progress bar on stderr: steps, loss and samples/s."""

    def __init__(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=_console(),
            transient=False,
        )
        self.task = self.progress.add_task("steps", total=None, detail="")
        self.progress.start()

    def log(self, message: str) -> None:
        self.progress.console.print(message, highlight=False, markup=False)

    def update(self, job: dict[str, Any]) -> None:
        progress = job.get("progress") or {}
        loss = (job.get("loss") or {}).get("last")
        detail = f"loss {loss:.4f}" if loss is not None else ""
        if progress.get("samples_per_s"):
            detail += f"  {progress['samples_per_s']:.0f} samples/s"
        self.progress.update(
            self.task,
            completed=progress.get("steps_done", 0),
            total=progress.get("total_steps") or None,
            detail=detail,
        )

    def stop(self) -> None:
        self.progress.stop()


def _console() -> Any:
    from controlplane.cli.output import stderr_console

    return stderr_console()
