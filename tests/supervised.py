"""A local supervisor whose ranks are small programs: real log capture without training anything."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def supervise_programs(
    run_dir: Path, programs: dict[int, str], cap_bytes: int | None = None
) -> subprocess.Popen[bytes]:
    """Start a supervisor (in the foreground) whose ranks run ``programs`` instead of the rank launcher.

    launch.json's ``python`` is a wrapper that runs the rank's program, found by its config path; the
    supervisor starts it as it starts any rank. Returns the supervisor's process once it has finished,
    unless the programs wait for something (then it is still running)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    wrapper = run_dir / "rank-program"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# argv: -m runtime.backends.local.rank --config RUN_DIR/rankN.json ...: run rankN.py instead\n"
        f'exec {sys.executable} "${{4%.json}}.py"\n'
    )
    wrapper.chmod(0o755)
    entries = []
    for rank, program in programs.items():
        (run_dir / f"rank{rank}.py").write_text(program)
        entries.append({"rank": rank, "config": str(run_dir / f"rank{rank}.json"), "speed": 1.0})
    launch = {"job_id": "logs-test", "python": str(wrapper), "sample_time_ms": 0.0, "grace_s": 2.0, "ranks": entries}
    if cap_bytes is not None:
        launch["log_cap_bytes"] = cap_bytes
    (run_dir / "launch.json").write_text(json.dumps(launch))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "runtime.backends.local.supervisor", str(run_dir), "--foreground"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    if not any("release" in p for p in programs.values()):
        assert supervisor.wait(timeout=60) == 0
    return supervisor
