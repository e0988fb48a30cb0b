"""Benchmarks on emulated devices: the suite per flavor, and worker ranks at chosen speeds.

The local backend is the one place that knows how a flavor is emulated: a flavor's
``relative_speed`` pads each training step to ``samples * sample_time_ms / 1000 / speed`` seconds
(``emulation.make_padding_hook``). This module applies that same hook to benchmarks:

- ``benchmark_flavors``: ``runtime.bench``'s suite in a child process per flavor (one at a time,
  so they do not compete for cores), the flavor's padding hook called after each training step;
  the child is ``python -m runtime.backends.local.bench --speed S --sample-time-ms T``.
- ``run_emulated_ranks``: worker ranks launched as the backend launches them (the rank launcher,
  ``runtime.backends.local.rank``), each at its own speed; ``runtime.bench.balance`` uses it.

What the emulation means for the figures: a step lasts at least its padded time, so a flavor's
figure is the lower of the host's real speed and the emulated one. A class whose real step on this
host already takes longer than its padded time (``resnet-small`` and ``transformer-small`` on two
CPU cores, at speeds near 1.0) shows the host's speed on every such flavor, as a job of that class
would if the local backend ran it. The micro-benchmarks have no steps to pad: they measure the
host, and run per flavor only when asked (``micro=True``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import runtime
from runtime.backends.base import Phase
from runtime.backends.local.backend import LocalBackend, relative_speed
from runtime.worker.config import WorkerConfig

if TYPE_CHECKING:
    from runtime.bench.suite import SuiteResult

_MODULE = "runtime.backends.local.bench"
_RANK_MODULE = "runtime.backends.local.rank"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(runtime.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env


def _speed(profiles: Mapping[str, Mapping[str, Any]], flavor: str) -> float:
    return relative_speed({k: dict(v) for k, v in profiles.items()}, flavor)


def benchmark_flavors(
    profiles: Mapping[str, Mapping[str, Any]],
    flavors: Sequence[str] | None = None,
    *,
    sample_time_ms: float = 0.5,
    quick: bool = True,
    micro: bool = False,
    job_classes: Sequence[str] | None = None,
    python: str = sys.executable,
    timeout_s: float = 300.0,
) -> dict[str, SuiteResult]:
    """Run the benchmark suite once per flavor with that flavor's emulation: ``{flavor: SuiteResult}``.

    ``profiles`` is ``Pool.local_profiles`` (flavor -> {"relative_speed": ...}); ``flavors`` picks
    some of them (default: all). Raises ValueError for a flavor without a profile and RuntimeError
    naming the flavor when its child fails.
    """
    from runtime.bench.suite import SuiteResult  # torch, only when benchmarks run

    chosen = list(flavors) if flavors is not None else sorted(profiles)
    speeds = {flavor: _speed(profiles, flavor) for flavor in chosen}  # every flavor checked before any runs
    results: dict[str, SuiteResult] = {}
    for flavor in chosen:
        command = [python, "-m", _MODULE, "--speed", repr(speeds[flavor]), "--sample-time-ms", repr(sample_time_ms)]
        command += ["--quick"] if quick else []
        command += [] if micro else ["--no-micro"]
        for job_class in job_classes or ():
            command += ["--class", job_class]
        try:
            done = subprocess.run(  # noqa: S603 (our interpreter and module, no shell)
                command, capture_output=True, text=True, env=_env(), timeout=timeout_s, stdin=subprocess.DEVNULL
            )
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"benchmarks of flavor {flavor!r} took longer than {timeout_s:.0f} s") from None
        if done.returncode != 0:
            tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"benchmarks of flavor {flavor!r} failed (exit {done.returncode}): {tail[0]}")
        raw = json.loads(done.stdout.strip().splitlines()[-1])
        raw["settings"] = {**raw.get("settings", {}), "flavor": flavor}
        results[flavor] = SuiteResult.from_dict(raw)
    return results


@dataclass(frozen=True)
class RankRun:
    """How one emulated rank ended, and its step telemetry (the worker's ``step`` events)."""

    rank: int
    exit_code: int
    steps: list[dict[str, Any]]
    stderr_tail: str


def run_emulated_ranks(
    configs: Sequence[WorkerConfig],
    speeds: Sequence[float],
    *,
    sample_time_ms: float = 0.5,
    workdir: str | Path | None = None,
    python: str = sys.executable,
    timeout_s: float = 120.0,
) -> list[RankRun]:
    """Run worker ranks, each at its relative speed, as the backend would; wait for all of them.

    The configs' ``telemetry_file`` is set here (in ``workdir``, a temporary folder by default) and
    each rank's step events are returned. Ranks still running at ``timeout_s`` are killed.
    """
    if len(configs) != len(speeds):
        raise ValueError(f"speeds: give one per config ({len(configs)}), got {len(speeds)}")
    with tempfile.TemporaryDirectory(prefix="polychip-ranks-") as tmp:
        folder = Path(workdir) if workdir is not None else Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        procs: list[tuple[WorkerConfig, Path, subprocess.Popen[bytes], Any]] = []
        try:
            for config, speed in zip(configs, speeds, strict=True):
                telemetry = folder / f"{config.job_id}.telemetry.rank{config.rank}.jsonl"
                data = {**config.to_dict(), "telemetry_file": str(telemetry), "telemetry_url": None}
                path = folder / f"{config.job_id}.rank{config.rank}.json"
                path.write_text(json.dumps(data))
                err = open(folder / f"{config.job_id}.rank{config.rank}.err", "w+b")  # noqa: SIM115 (closed below)
                command = [python, "-m", _RANK_MODULE, "--config", str(path), "--speed", repr(float(speed))]
                command += ["--sample-time-ms", repr(sample_time_ms)]
                proc = subprocess.Popen(  # noqa: S603 (our interpreter and module, no shell)
                    command, stdout=subprocess.DEVNULL, stderr=err, env=_env()
                )
                procs.append((config, telemetry, proc, err))
            deadline = time.monotonic() + timeout_s
            for _, _, proc, _ in procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            runs = []
            for config, telemetry, proc, err in procs:
                err.seek(0)
                tail = err.read().decode(errors="replace").strip().splitlines()[-1:]
                runs.append(RankRun(config.rank, proc.returncode, step_events(telemetry), tail[0] if tail else ""))
            return runs
        finally:
            for _, _, proc, err in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                err.close()


def telemetry_events(path: Path, kind: str) -> list[dict[str, Any]]:
    """A rank's events of one ``kind`` from its telemetry file, in file order (a line being written is
    skipped)."""
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("kind") == kind:
            events.append(event)
    return events


def step_events(path: Path) -> list[dict[str, Any]]:
    """A rank's ``step`` events from its telemetry file, in step order."""
    return sorted(telemetry_events(path, "step"), key=lambda e: e["step"])


def wait_for_jobs(backend: LocalBackend, handles: dict[str, dict[str, Any]], timeout_s: float) -> None:
    """Wait until every job (name -> handle) has succeeded. A job that fails raises with its reason;
    at the deadline the jobs still running are torn down and ``TimeoutError`` names them."""
    deadline = time.monotonic() + timeout_s
    pending = dict(handles)
    while pending:
        for job, handle in list(pending.items()):
            observation = backend.observe(handle)
            if observation.phase == Phase.SUCCEEDED:
                del pending[job]
            elif observation.phase in (Phase.FAILED, Phase.GONE):
                raise RuntimeError(f"{job}: {observation.reason or observation.phase}")
        if pending and time.monotonic() > deadline:
            for handle in pending.values():
                backend.teardown(handle)
            raise TimeoutError(f"still running after {timeout_s} s: {', '.join(pending)}")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    """The per-flavor child: the suite with this flavor's padding hook; one JSON line on stdout."""
    from runtime.backends.local.emulation import SpeedSource, make_padding_hook
    from runtime.bench.macro import WORKLOADS
    from runtime.bench.suite import run_suite

    parser = argparse.ArgumentParser(prog=f"python -m {_MODULE}")
    parser.add_argument("--speed", type=float, required=True, help="relative speed, 1.0 = reference chip")
    parser.add_argument("--sample-time-ms", type=float, required=True, help="emulated time per sample at speed 1.0")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-micro", action="store_true")
    parser.add_argument("--class", dest="job_classes", action="append", choices=sorted(WORKLOADS))
    args = parser.parse_args(argv)
    import torch

    # One intra-op thread, as each rank of the local backend runs (runtime.worker.train): the figure
    # is what a rank of that flavor does here, and a shared host's other load cannot stall a
    # thread pool that waits on a descheduled peer.
    torch.set_num_threads(1)
    try:
        hook = make_padding_hook(args.sample_time_ms, SpeedSource(args.speed))
    except ValueError as exc:
        print(f"local benchmark: {exc}", file=sys.stderr, flush=True)  # noqa: T201 (a CLI's error)
        return 2
    result = run_suite(
        quick=args.quick,
        micro=not args.no_micro,
        job_classes=args.job_classes,
        step_hooks=[hook],
        settings={"emulation": {"relative_speed": args.speed, "sample_time_ms": args.sample_time_ms}},
    )
    print(json.dumps(result.to_dict()), flush=True)  # noqa: T201 (the answer the parent reads from stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
