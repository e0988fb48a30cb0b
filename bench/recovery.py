"""Recovery figures: kill -9 a rank of a running job and measure how the control plane brings it back.

    python bench/recovery.py [--quick]

1. Kill trials, through the real control plane. Polychip starts on the embedded default (SQLite,
   filesystem broker, local backend) in a scratch directory, as `make demo` does. A reference job (3
   ranks, seed 5) runs uninterrupted; then each trial submits the same job, waits until it passes a
   random step, and kills one rank with SIGKILL (rank 0, 1, 2 in turn). Nobody intervenes after that.
   Per trial:
   - detect_s: the kill to the supervisor's detection (the failure's detected_at);
   - observe_s: the kill to the control plane's "failure detected" event;
   - kill_to_resume_s: the kill to the first step of the restored attempt (target: median under 8 s,
     max under 15 s on a 2-core host), and its parts one after the other (``SPLIT``): split_detect_s,
     split_freeze_s (the control plane observes, tears down, freezes), split_reallocate_s (devices
     chosen, next attempt launched, its supervisor starts the ranks), split_start_s (the ranks ready:
     interpreter, torch and code loaded, fresh or in a warm standby), split_rendezvous_s,
     split_restore_s, split_first_step_s; warm_ranks: the restarted ranks that ran in a standby;
   - steps_lost: the killed attempt's last step (its survivors' telemetry) minus the step restored;
   - final_loss_gap: (L_trial - L_ref) / (L_initial - L_ref) at the final step.
   Between trials the operator's command returns the device that recovery marked failed.
2. Checkpoint stall, in this process: a model of about 17 MB of weights (and as much momentum) saved
   every 20 training steps, with the background saver and synchronously; the median time the
   training thread is held, the size of a full checkpoint and the write throughput.
3. Restore semantics, in this process: when the newest weights (every 10 steps) are newer than the
   newest optimizer state (every 50), resume from those weights with the older momentum
   ("newest_weights"), or from the last checkpoint with both ("last_full")? Each failure point gets the
   same number of steps after the restart; the loss gap on the whole data set says which is better.
4. The failure predictor (LSTM) against the threshold baseline on held-out synthetic device histories:
   precision and recall at a 30-minute horizon (runtime.recovery.predict; the data are synthetic); and
   the operating rule on top of the LSTM (score every 5 minutes, drain after 1 or 3 alerts in a row):
   false alert episodes per healthy device-hour and the share of failing devices warned in time.

--quick runs 3 trials (one kill of each rank) and smaller versions of 2-4. The last line printed is one
JSON object of the figures.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, bench/ heads sys.path, and bench/kubernetes.py would shadow the kubernetes client.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from bench.skeleton import cli, free_port  # noqa: E402
from controlplane.cli.api import Api as Client  # noqa: E402
from runtime.jobspec import CheckpointSpec  # noqa: E402
from runtime.recovery.checkpoint import Checkpointer  # noqa: E402
from runtime.recovery.health import generate_histories  # noqa: E402
from runtime.recovery.predict import alert_policy_view, train_and_evaluate  # noqa: E402
from runtime.recovery.store import LocalStore  # noqa: E402
from runtime.worker.workload import SyntheticDataset, build_student, make_optimizer  # noqa: E402

WEIGHTS_EVERY = 10
SPEC = {
    "name": "bench-recovery",
    "devices": 3,
    "flavors": ["ascend-910b"],
    "workload": {"steps": 150, "global_batch": 96, "seed": 5, "lr": 0.05},
    "checkpoint": {"weights_every": WEIGHTS_EVERY, "optimizer_every": 5 * WEIGHTS_EVERY, "keep": 3},
    "max_restarts": 3,
}
FINAL = {"succeeded", "failed", "cancelled"}


# --- 1. kill trials through the control plane ---------------------------------------------------


def _wait(predicate: Any, timeout_s: float, what: str, every_s: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} did not happen within {timeout_s:.0f} s")
        time.sleep(every_s)


def _run_dirs(runs: Path, job_id: int) -> list[Path]:
    """The job's run folders, one per attempt, in attempt order."""
    found = [d for d in runs.glob(f"job-{job_id}-*") if d.is_dir()]
    # The first attempt's folder has no suffix, the next ones end in "-a1", "-a2", ...
    return sorted(
        found, key=lambda d: int(d.name.rsplit("-a", 1)[1]) if re.fullmatch(r"a\d+", d.name.split("-")[-1]) else 0
    )


def _step_events(run_dir: Path) -> list[dict[str, Any]]:
    events = []
    for path in run_dir.glob("telemetry.rank*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue  # being written
            if event.get("kind") == "step":
                events.append(event)
    return events


def _last_step(run_dir: Path) -> int:
    return max((e["step"] for e in _step_events(run_dir)), default=0)


def _finish(client: Client, job_id: int, timeout_s: float = 300) -> dict[str, Any]:
    # Through the API: 4 requests a second, well inside a token's rate limit (POLYCHIP_RATE_PER_TOKEN, 20/s).
    return _wait(
        lambda: (job := client.job(job_id))["state"] in FINAL and job, timeout_s, f"job {job_id} ending", every_s=0.25
    )


def kill_trials(trials: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="polychip-bench-recovery-") as scratch:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        env = {
            k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "CELERY_BROKER_URL", "CHANNEL_REDIS_URL"}
        }
        env.update(POLYCHIP_VAR_DIR=scratch, POLYCHIP_PUBLIC_URL=url, POLYCHIP_LOCAL_TELEMETRY_FILES="1")
        runs = Path(scratch) / "runs"
        print(f"embedded default in {scratch}, port {port}", flush=True)
        cli(env, "demo", "--no-job", "--port", str(port))
        try:
            client = Client(url, (Path(scratch) / "demo-token").read_text().strip())
            reference = _finish(client, client.submit({**SPEC, "name": "bench-reference"})["id"])
            if reference["state"] != "succeeded":
                raise SystemExit(f"bench: the reference job ended {reference['state']}: {reference['failure_reason']}")
            first, last = float(reference["loss"]["first"]), float(reference["loss"]["last"])
            print(f"  reference: loss {first:.4f} -> {last:.4f} in {SPEC['workload']['steps']} steps", flush=True)
            results = [_trial(client, runs, env, trial, first, last) for trial in range(trials)]
        finally:
            cli(env, "down")
    recovered = [r for r in results if r["recovered"]]
    figures: dict[str, Any] = {"trials": trials, "recovered": len(recovered)}
    for name in ("detect_s", "observe_s", "kill_to_resume_s", "steps_lost", "final_loss_gap", *SPLIT, "warm_ranks"):
        values = [r[name] for r in recovered if r[name] is not None]
        figures[name] = round(statistics.median(values), 4) if values else None
        figures[f"{name}_max"] = round(max(values, key=abs), 4) if values else None
    figures["weights_every"] = WEIGHTS_EVERY
    return figures


def _trial(client: Client, runs: Path, env: dict[str, str], trial: int, first: float, last: float) -> dict[str, Any]:
    victim = trial % 3
    kill_at = random.Random(trial).randint(15, 110)
    job_id = client.submit({**SPEC, "name": f"bench-trial-{trial}"})["id"]
    run_dir = _wait(lambda: _run_dirs(runs, job_id), 60, "the first attempt's launch")[0]
    _wait(lambda: _last_step(run_dir) >= kill_at, 120, f"step {kill_at}")
    status = json.loads((run_dir / "status.json").read_text())
    pid = next(r["pid"] for r in status["ranks"] if r["rank"] == victim)
    killed_at = time.time()
    os.kill(pid, signal.SIGKILL)

    job = _finish(client, job_id)
    recovery = job["recovery"] or {}
    failure, restored, resumed = recovery.get("last_failure"), recovery.get("restored"), recovery.get("resumed")
    ok = job["state"] == "succeeded" and job["restarts"] >= 1 and bool(restored and resumed)
    events = {"events": list(client.pages(f"/api/v1/jobs/{job_id}/events", "events", limit=None))}
    detected = [e for e in events["events"] if str(e.get("message", "")).startswith("failure detected")]
    result = {
        "recovered": ok,
        "detect_s": failure["detected_at"] - killed_at if failure else None,
        "observe_s": datetime.fromisoformat(detected[0]["created_at"]).timestamp() - killed_at if detected else None,
        "kill_to_resume_s": resumed["ts"] - killed_at if resumed else None,
        "steps_lost": _last_step(run_dir) - restored["step"] if restored else None,
        "final_loss_gap": (float(job["loss"]["last"]) - last) / (first - last) if ok else None,
    }
    attempts = _run_dirs(runs, job_id)
    if ok and failure and restored and resumed and len(attempts) > 1:
        result |= _split(events["events"], attempts[1], failure["detected_at"], restored, resumed) | {
            "split_detect_s": failure["detected_at"] - killed_at
        }
    shown = {k: (round(v, 3) if isinstance(v, float) else v) for k, v in result.items()}
    print(f"  trial {trial}: kill rank {victim} at step >= {kill_at}: {shown}", flush=True)
    # The operator returns the device that recovery marked failed, so the pool stays the same size.
    subprocess.run(
        [sys.executable, "manage.py", "device_health", "--return-failed"],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    return result


# Where the time from the kill to the first step goes, one after the other (they add up to
# kill_to_resume_s): the supervisor sees the rank die; the control plane observes it, stops the run and
# freezes the job (the "frozen" event); it chooses the devices and launches the next attempt, whose
# supervisor starts its ranks (their earliest start, from its status); the ranks load the interpreter,
# torch and the code, fresh or in a warm standby (the last rank ready, from the "started" events'
# ready_ts); they join the rendezvous (the last "started"); rank 0 restores the checkpoint ("restored");
# the first step ends ("resumed").
SPLIT = (
    "split_detect_s",
    "split_freeze_s",
    "split_reallocate_s",
    "split_start_s",
    "split_rendezvous_s",
    "split_restore_s",
    "split_first_step_s",
)


def _split(
    events: list[dict[str, Any]], next_run: Path, detected_at: float, restored: dict[str, Any], resumed: dict[str, Any]
) -> dict[str, Any]:
    frozen = [e for e in events if str(e.get("message", "")).startswith("frozen")]
    status = json.loads((next_run / "status.json").read_text())
    spawned = [r["spawned_at"] for r in status["ranks"] if r.get("spawned_at")]
    started: dict[int, dict[str, Any]] = {}
    for path in next_run.glob("telemetry.rank*.jsonl"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("kind") == "started":
                started[event["rank"]] = event
    if not frozen or not spawned or len(started) != len(status["ranks"]):
        return {}
    frozen_at = datetime.fromisoformat(frozen[0]["created_at"]).timestamp()
    ready = max(e.get("ready_ts", e["ts"]) for e in started.values())
    joined = max(e["ts"] for e in started.values())
    return {
        "split_freeze_s": frozen_at - detected_at,
        "split_reallocate_s": min(spawned) - frozen_at,
        "split_start_s": ready - min(spawned),
        "split_rendezvous_s": joined - ready,
        "split_restore_s": restored["ts"] - joined,
        "split_first_step_s": resumed["ts"] - restored["ts"],
        # Ranks of the restarted attempt that ran in a warm standby (runtime.backends.local.standby).
        "warm_ranks": sum(1 for r in status["ranks"] if r.get("standby")),
    }


# --- 2. checkpoint stall --------------------------------------------------------------------------


def stall_figures(quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    hidden = 2048  # about 4.3M parameters: 17 MB of weights, as much momentum
    saves = 4 if quick else 12
    dataset = SyntheticDataset(0, 96)
    figures: dict[str, Any] = {}
    for background in (True, False):
        model = build_student(hidden, 0)
        optimizer = make_optimizer(model.parameters(), 0.05)
        with tempfile.TemporaryDirectory(prefix="polychip-bench-ckpt-") as tmp:
            spec = CheckpointSpec(weights_every=20, optimizer_every=20, keep=2)
            checkpointer = Checkpointer(LocalStore(tmp), spec, background=background)
            stalls = []
            for step in range(1, saves * 20 + 1):
                inputs, labels = dataset.global_batch_at(step - 1)
                optimizer.zero_grad()
                F.cross_entropy(model(inputs), labels).backward()
                optimizer.step()
                record = checkpointer.maybe_save(step, model, optimizer, {"step": step})
                if record is not None:
                    stalls.append(record.stall_s)
            checkpointer.close()
            records = checkpointer.records
        name = "background" if background else "sync"
        figures[f"stall_ms_{name}"] = round(statistics.median(stalls) * 1000, 3)
        if background:
            figures["checkpoint_mb"] = round(statistics.median(r.bytes for r in records) / 1e6, 2)
            figures["write_mb_s"] = round(statistics.median(r.bytes / r.write_s for r in records) / 1e6, 1)
        print(f"  {name}: stalls (ms) {[round(s * 1000, 1) for s in stalls]}", flush=True)
    return figures


# --- 3. restore semantics -------------------------------------------------------------------------


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: SyntheticDataset, steps: range) -> None:
    for step in steps:
        inputs, labels = data.global_batch_at(step - 1)
        optimizer.zero_grad()
        F.cross_entropy(model(inputs), labels).backward()
        optimizer.step()


def _loss(model: torch.nn.Module, data: SyntheticDataset) -> float:
    with torch.no_grad():
        return float(F.cross_entropy(model(data.inputs), data.labels))


def _reference_run(seed: int, total: int, weights_every: int, optimizer_every: int) -> dict[str, Any]:
    data = SyntheticDataset(seed, 96)
    model = build_student(64, seed)
    optimizer = make_optimizer(model.parameters(), 0.05)
    run: dict[str, Any] = {"data": data, "initial": _loss(model, data), "weights": {}, "moments": {}}
    for step in range(1, total + 1):
        _train(model, optimizer, data, range(step, step + 1))
        if step % weights_every == 0:
            run["weights"][step] = copy.deepcopy(model.state_dict())
        if step % optimizer_every == 0:
            run["moments"][step] = copy.deepcopy(optimizer.state_dict())
    run["final"] = _loss(model, data)
    return run


def restore_semantics(quick: bool) -> dict[str, Any]:
    """Equal work after the restart, two ways to restart; the loss gap against the uninterrupted run.

    For each seed and failure point, both restarts get the same number of steps after the failure
    (what the job can do in the time it has left): newest_weights starts from the newer weights and so
    ends further along; last_full starts from consistent but older state."""
    torch.set_num_threads(1)
    weights_every, optimizer_every, total = 10, 50, 300
    seeds = range(2) if quick else range(6)
    failures = range(60, 260, 20 if quick else 10)
    gaps: dict[str, list[float]] = {"newest_weights": [], "last_full": []}
    for seed in seeds:
        run = _reference_run(seed, total, weights_every, optimizer_every)
        initial, reference, data = run["initial"], run["final"], run["data"]
        for failed_at in failures:
            newest, full = failed_at // weights_every * weights_every, failed_at // optimizer_every * optimizer_every
            budget = total - newest  # the steps the job gets after the restart, either way
            for mode, (w, o) in {"newest_weights": (newest, full), "last_full": (full, full)}.items():
                model = build_student(64, seed)
                optimizer = make_optimizer(model.parameters(), 0.05)
                model.load_state_dict(run["weights"][w])
                optimizer.load_state_dict(run["moments"][o])
                _train(model, optimizer, data, range(w + 1, w + budget + 1))
                gaps[mode].append((_loss(model, data) - reference) / (initial - reference))
    differences = [a - b for a, b in zip(gaps["newest_weights"], gaps["last_full"], strict=True)]
    figures: dict[str, Any] = {f"restore_gap_{mode}": round(statistics.mean(v), 5) for mode, v in gaps.items()}
    # Paired over the same seeds and failure points: newest_weights minus last_full, and its standard error.
    figures["restore_gap_difference"] = round(statistics.mean(differences), 5)
    figures["restore_gap_difference_se"] = round(statistics.stdev(differences) / len(differences) ** 0.5, 5)
    figures["restore_better"] = min(gaps, key=lambda mode: statistics.mean(gaps[mode]))
    figures["restore_cases"] = len(differences)
    print(f"  restore semantics over {len(differences)} cases: {figures}", flush=True)
    return figures


# --- 4. the failure predictor ---------------------------------------------------------------------


def predictor_figures(quick: bool) -> dict[str, Any]:
    torch.set_num_threads(1)
    result = train_and_evaluate(seed=0, quick=quick)
    predictor, baseline = result["predictor"], result["baseline"]
    print(
        f"  predictor (synthetic histories, {result['horizon_min']} min horizon): "
        f"LSTM precision {predictor.precision:.3f} recall {predictor.recall:.3f}; "
        f"threshold baseline precision {baseline.precision:.3f} recall {baseline.recall:.3f}; "
        f"positive windows {result['positive_rate']:.3f}",
        flush=True,
    )
    # In operation a device is scored every 5 minutes and drained after ALERT_STREAK alerts in a row.
    held_out = generate_histories(80 if quick else 300, seed=1001)
    persistence: dict[str, Any] = {}
    for streak in (1, 3):
        view = alert_policy_view(result["models"]["predictor"], held_out, streak=streak)
        persistence[f"false_alerts_per_device_hour_streak{streak}"] = round(view.false_alerts_per_device_hour, 4)
        persistence[f"failures_warned_streak{streak}"] = round(view.failures_warned, 3)
    print(f"  alert persistence on {len(held_out)} more held-out devices: {persistence}", flush=True)
    return persistence | {
        "predictor_precision": round(predictor.precision, 3),
        "predictor_recall": round(predictor.recall, 3),
        "baseline_precision": round(baseline.precision, 3),
        "baseline_recall": round(baseline.recall, 3),
        "predictor_accuracy": round(predictor.accuracy, 3),
        "predictor_positive_rate": round(result["positive_rate"], 3),
    }


# --- 5. the tenant's own code: a restart in fresh ranks or in warm standbys -------------------------


def user_code_restarts(trials: int) -> dict[str, Any]:
    """A python job (runtime/sdk/examples/python_sdk, 3 ranks, run as its own user when the control
    plane is root) on the local backend, no control plane: kill -9 of a rank after a checkpoint,
    then the restart as recovery provisions it (same job, same store). The kill to the restart's
    first step, with ranks started fresh and with the host's warm standbys (which become the job's
    user before the rank starts); the median of ``trials`` each."""
    from runtime.backends.base import Phase
    from runtime.backends.local import LocalBackend
    from runtime.backends.local import standby as standby_module
    from runtime.backends.local.sandbox import unavailable_reason
    from runtime.inventory import load_pool
    from tests.usercode import SDK_EXAMPLE, make_bundle, user_request

    def pool_full(backend: LocalBackend, size: int) -> bool:
        return len(standby_module.pool_state(backend.standby_dir).get("standbys", [])) >= size

    profiles = load_pool(ROOT / "runtime" / "pools" / "demo.yaml").local_profiles
    spec = CheckpointSpec(weights_every=10, optimizer_every=10, keep=3)
    figures: dict[str, Any] = {"usercode_sandboxed": unavailable_reason() is None}
    # Outside /tmp's pytest-style private folders: the job's user must pass through every folder above.
    with tempfile.TemporaryDirectory(prefix="polychip-bench-usercode-") as folder:
        scratch = Path(folder)
        os.chmod(scratch, 0o711)  # noqa: S103 (traversable, not listable, as the control plane's var/)
        bundle = make_bundle(scratch / "bundle", {"train.py": SDK_EXAMPLE.read_text()})
        for mode, standbys in (("fresh", 0), ("warm", 4)):
            backend = LocalBackend(
                scratch / f"runs-{mode}", profiles, sample_time_ms=0.2, telemetry_files=True, standby_ranks=standbys
            )
            times, warm_ranks = [], 0
            try:
                if standbys:  # the host's pool, warm before the failure (the first launch starts it)
                    standby_module.start_pool(backend.standby_dir, standbys, backend.python, backend.standby_env())
                    _wait(lambda b=backend, n=standbys: pool_full(b, n), 120, "the standby pool")
                for trial in range(trials):
                    key = f"{mode}-{trial}"
                    common = {"checkpoint": spec, "job_key": key, "steps": 100_000}
                    first = backend.provision(user_request(f"{key}-a0", scratch, bundle, **common))
                    store = LocalStore(str(scratch / "checkpoints" / key))
                    _wait(lambda store=store: len(store.names()) >= 2, 300, "two checkpoints")
                    if standbys:  # the claimed standbys replaced, as in a long run
                        _wait(lambda b=backend, n=standbys: pool_full(b, n), 60, "the pool refilled")
                    status = json.loads((Path(first["run_dir"]) / "status.json").read_text())
                    killed_at = time.time()
                    os.kill(next(r["pid"] for r in status["ranks"] if r["rank"] == 1), signal.SIGKILL)
                    _wait(lambda h=first, b=backend: b.observe(h).phase == Phase.FAILED, 60, "the failure")
                    second = backend.provision(user_request(f"{key}-a1", scratch, bundle, **{**common, "steps": 200}))
                    run_dir = Path(second["run_dir"])
                    first_step = _wait(
                        lambda d=run_dir: min((e["ts"] for e in _step_events(d / "work")), default=None), 240, "a step"
                    )
                    times.append(first_step - killed_at)
                    ranks = json.loads((run_dir / "status.json").read_text())["ranks"]
                    warm_ranks += sum(1 for r in ranks if r.get("standby"))
                    backend.teardown(second)
                    backend.teardown(first)
                    print(f"  {mode}: kill to the restart's first step {times[-1]:.2f} s", flush=True)
            finally:
                backend.tear_down_every_run()
            figures[f"usercode_kill_to_first_step_s_{mode}"] = round(statistics.median(times), 2)
            figures[f"usercode_warm_ranks_{mode}"] = warm_ranks
    figures["usercode_warm_vs_fresh"] = round(
        figures["usercode_kill_to_first_step_s_warm"] / figures["usercode_kill_to_first_step_s_fresh"], 3
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 kill trials and smaller in-process measurements")
    parser.add_argument("--trials", type=int, default=None, help="kill trials (default 12, 3 with --quick)")
    args = parser.parse_args()
    trials = args.trials or (3 if args.quick else 12)
    figures: dict[str, Any] = {}
    print("checkpoint stall:", flush=True)
    figures |= stall_figures(args.quick)
    print("restore semantics:", flush=True)
    figures |= restore_semantics(args.quick)
    print("failure predictor:", flush=True)
    figures |= predictor_figures(args.quick)
    print("the tenant's own code, restarted fresh and in warm standbys:", flush=True)
    figures |= user_code_restarts(1 if args.quick else 3)
    print(f"kill trials ({trials}):", flush=True)
    figures = kill_trials(trials) | figures
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
