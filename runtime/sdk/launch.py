"""How a rank's code gets its context, and how the worker runs the tenant's code.

Under Polychip the rank launcher builds the rank's ``WorkerConfig`` (and the local backend's step
hooks and device probe) and hands them to ``init`` through ``_Launch``; the tenant's code never
reads a config file. Outside Polychip, ``init`` builds a one-process config from its arguments.
"""

from __future__ import annotations

import importlib
import os
import runpy
import socket
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.jobspec import WorkloadSpec
from runtime.worker.config import DeviceProbe, StepHook, TrainResult, WorkerConfig, equal_split

if TYPE_CHECKING:
    from runtime.sdk.context import TrainingContext


@dataclass
class _Launch:
    config: WorkerConfig
    hooks: tuple[StepHook, ...] = ()
    probe: DeviceProbe | None = None
    context: TrainingContext | None = None


_launch: _Launch | None = None


def init(*, steps: int = 100, global_batch: int = 32, lr: float = 0.01, seed: int = 0) -> TrainingContext:
    """This rank's training context, to use as ``with init() as ctx:``.

    Under Polychip every argument is ignored: the job's spec decides. Elsewhere they make a
    one-process run (rank 0 of 1, no telemetry, no checkpoints, the model saved to
    ``./polychip-artifacts``) so that a script can be tried as it is."""
    from runtime.sdk.context import TrainingContext

    if _launch is not None:
        if _launch.context is not None:
            raise RuntimeError("init() is called once per rank")
        _launch.context = TrainingContext(_launch.config, _launch.hooks, _launch.probe)
        return _launch.context
    workload = WorkloadSpec(kind="python", steps=steps, global_batch=global_batch, lr=lr, seed=seed)
    return TrainingContext(standalone_config(workload))


def current_context() -> TrainingContext | None:
    """The context ``init`` made in this process, if any."""
    return _launch.context if _launch is not None else None


def standalone_config(workload: WorkloadSpec, artifacts_dir: str = "polychip-artifacts") -> WorkerConfig:
    """One process, rank 0 of 1, rendezvous on a free loopback port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return WorkerConfig(
        job_id="standalone",
        rank=0,
        world_size=1,
        master_addr="127.0.0.1",
        master_port=port,
        flavor="local",
        device_id="local",
        workload=workload,
        micro_batches=equal_split(workload.global_batch, 1),
        artifacts_dir=artifacts_dir,
    )


class EntrypointError(RuntimeError):
    """The job's entrypoint cannot be found or does not use the training API."""


def run_python(config: WorkerConfig, hooks: Sequence[StepHook] = (), probe: DeviceProbe | None = None) -> TrainResult:
    """Run a ``python`` job's entrypoint with the training API available; its context's result.

    ``module:function`` is imported from the bundle and called with no arguments; a script path runs
    as ``__main__``. Either calls ``runtime.sdk.init()``. ``sys.argv`` is the entrypoint and the job's
    ``args``."""
    global _launch
    code_dir = _code_dir(config)
    entry = config.workload.entrypoint
    _launch = _Launch(config, tuple(hooks), probe)
    sys.path.insert(0, str(code_dir))
    sys.argv = [entry, *config.workload.args]
    try:
        if ":" in entry:
            module_name, _, function_name = entry.partition(":")
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name and module_name.startswith(exc.name):
                    raise EntrypointError(
                        f"workload.entrypoint {entry!r}: no module {exc.name!r} in the bundle"
                    ) from None
                raise
            function = getattr(module, function_name, None)
            if not callable(function):
                raise EntrypointError(f"workload.entrypoint {entry!r}: {module_name} has no function {function_name}")
            function()
        else:
            script = _inside(code_dir, entry)
            _run_script(script)
        context = _launch.context
        if context is None:
            raise EntrypointError(
                f"workload.entrypoint {entry!r} returned without calling runtime.sdk.init(); "
                "a python job trains through the training API (an unmodified DDP script is kind torchrun)"
            )
        if context.result is None:
            raise EntrypointError(
                f"workload.entrypoint {entry!r} returned before its `with init() as ctx:` block ended"
            )
        return context.result
    finally:
        _launch = None


def _run_script(script: Path) -> None:
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as exc:
        if exc.code not in (None, 0):
            raise RuntimeError(f"{script.name} exited with {exc.code!r}") from None


def _code_dir(config: WorkerConfig) -> Path:
    if not config.code_dir:
        raise EntrypointError("this rank has no code folder (code_dir): the backend did not unpack the bundle")
    return Path(config.code_dir)


def _inside(code_dir: Path, entry: str) -> Path:
    script = (code_dir / entry).resolve()
    if not script.is_relative_to(code_dir.resolve()) or not script.is_file():
        raise EntrypointError(f"workload.entrypoint {entry!r}: no such script in the bundle")
    return script


def torchrun_env(config: WorkerConfig) -> dict[str, str]:
    """torchrun's environment contract for one rank (one process per device, one node per rank):
    the rendezvous is the run's store host, which the ranks join as clients
    (``TORCHELASTIC_USE_AGENT_STORE``), so no rank's death takes it down."""
    return {
        "RANK": str(config.rank),
        "WORLD_SIZE": str(config.world_size),
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": str(config.rank),
        "MASTER_ADDR": config.master_addr,
        "MASTER_PORT": str(config.master_port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_RUN_ID": config.job_id,
    }


def run_torchrun(config: WorkerConfig, probe: DeviceProbe | None = None) -> TrainResult:
    """Run an unmodified DDP script as torchrun would start it, with heartbeats beside it.

    It gets an equal share of nothing in particular (it splits its own data), no balancing and no
    gradient policy; it saves and restores its own checkpoints in ``POLYCHIP_CHECKPOINT_DIR``."""
    import time

    from runtime.worker.telemetry import Telemetry

    code_dir = _code_dir(config)
    script = _inside(code_dir, config.workload.entrypoint)
    os.environ.update(torchrun_env(config))
    sys.path.insert(0, str(script.parent))
    sys.argv = [str(script), *config.workload.args]
    telemetry = Telemetry(
        {"job": config.job_id, "rank": config.rank, "device_id": config.device_id, "flavor": config.flavor},
        url=config.telemetry_url,
        token=config.telemetry_token,
        file=config.telemetry_file,
        heartbeat_file=config.heartbeat_file,
        device_probe=probe,
    )
    started = time.monotonic()
    telemetry.start()
    try:
        telemetry.emit("started", world_size=config.world_size, steps=config.workload.steps, workload="torchrun")
        _run_script(script)
        telemetry.emit("finished", steps=0)
    except BaseException as exc:
        telemetry.emit("failed", error=f"{type(exc).__name__}: {exc}"[:2000])
        raise
    finally:
        telemetry.close()
    return TrainResult(
        steps=0, first_step=1, final_loss=float("nan"), losses=[], artifact=None, wall_time_s=time.monotonic() - started
    )
