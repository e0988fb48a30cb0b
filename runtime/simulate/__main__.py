"""Replay a job trace on a described cluster under a placement policy.

    python -m runtime.simulate --trace bench/data/gavel/trace_continuous_300.csv --policy aware
    python -m runtime.simulate --generate 10000 --jobs-per-hour 60 --cluster k80=100,p100=100,v100=100

Prints average, p50 and p99 job completion time, makespan, utilization (busy device-time over the
device-time the cluster offered until the makespan) and each tenant's device-hours against its
entitlement (weighted max-min of the cluster over the tenants' demand, round by round). A progress bar
goes to stderr; ``--json`` prints the figures as one JSON object instead of the table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from runtime.scheduling.policies import POLICIES, get_policy
from runtime.simulate.rounds import Cluster, run_rounds, summarize
from runtime.simulate.trace import TraceError, generate_trace, load_gavel_throughputs, load_trace, write_trace

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "bench" / "data" / "gavel"


def parse_cluster(text: str) -> dict[str, int]:
    """``k80=12,p100=12,v100=12`` -> {"k80": 12, ...}."""
    devices: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        flavor, _, count = part.partition("=")
        if not flavor or not count.isdigit() or int(count) < 1:
            raise argparse.ArgumentTypeError(
                f"--cluster: {part!r} is not FLAVOR=COUNT; write e.g. k80=12,p100=12,v100=12"
            )
        devices[flavor] = int(count)
    if not devices:
        raise argparse.ArgumentTypeError("--cluster: empty; write e.g. k80=12,p100=12,v100=12")
    return devices


class ProgressBar:
    """``[#####-----] 150/300 jobs  round 1234  sim 123.4 h  2.1 s`` on one rewritten line."""

    def __init__(self, stream=sys.stderr, width: int = 30, every_s: float = 0.2) -> None:  # type: ignore[no-untyped-def]
        self.stream, self.width, self.every_s = stream, width, every_s
        self.started = time.monotonic()
        self.shown = 0.0
        self.rounds = 0

    def __call__(self, done: int, total: int, now_s: float = 0.0) -> None:
        self.rounds += 1
        wall = time.monotonic()
        if done < total and wall - self.shown < self.every_s:
            return
        self.shown = wall
        filled = int(self.width * done / total) if total else self.width
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(
            f"\r[{bar}] {done}/{total} jobs  round {self.rounds}  sim {now_s / 3600:.1f} h  {wall - self.started:.1f} s"
        )
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.simulate", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--trace", type=Path, help="trace CSV (job_id, arrival_s, job_type, num_gpus, total_steps)")
    source.add_argument("--generate", type=int, metavar="N", help="generate a Gavel-like trace of N jobs instead")
    parser.add_argument("--throughputs", type=Path, default=DEFAULT_DATA / "throughputs.csv", help="throughput CSV")
    parser.add_argument("--cluster", type=parse_cluster, default=parse_cluster("k80=12,p100=12,v100=12"))
    parser.add_argument("--devices-per-server", type=int, default=12, help="a gang within one server is consolidated")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="aware")
    parser.add_argument("--round-s", type=float, default=360.0, help="round length, seconds (Gavel: 360)")
    parser.add_argument("--restart-cost-s", type=float, default=0.0, help="seconds a (re)start costs the job")
    parser.add_argument("--balance-efficiency", type=float, default=1.0, help="a mixed gang's efficiency, (0, 1]")
    parser.add_argument("--jobs-per-hour", type=float, default=1.2, help="with --generate: arrival rate")
    parser.add_argument("--tenants", type=int, default=1, help="with --generate: tenants, jobs dealt in turn")
    parser.add_argument("--seed", type=int, default=0, help="with --generate: random seed")
    parser.add_argument("--save-trace", type=Path, help="with --generate: also write the trace here")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)

    try:
        table = load_gavel_throughputs(args.throughputs)
        if args.generate is not None:
            if args.generate < 1 or args.tenants < 1 or args.jobs_per_hour <= 0:
                parser.error("--generate, --tenants and --jobs-per-hour must be positive")
            trace = generate_trace(
                table, jobs=args.generate, jobs_per_hour=args.jobs_per_hour, seed=args.seed, tenants=args.tenants
            )
            if args.save_trace:
                write_trace(args.save_trace, trace)
        else:
            trace = load_trace(args.trace or DEFAULT_DATA / "trace_continuous_300.csv", table)
        cluster = Cluster(args.cluster, {flavor: args.devices_per_server for flavor in args.cluster})
        progress = None if args.quiet else ProgressBar()
        started = time.monotonic()
        result = run_rounds(
            trace,
            cluster,
            get_policy(args.policy),
            table,
            round_s=args.round_s,
            restart_cost_s=args.restart_cost_s,
            balance_efficiency=args.balance_efficiency,
            progress=progress,
        )
    except (TraceError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    wall_s = time.monotonic() - started
    summary = summarize(result)
    figures = {
        "policy": args.policy,
        "jobs": summary.jobs,
        "avg_jct_h": round(summary.avg_jct_h, 3),
        "p50_jct_h": round(summary.p50_jct_h, 3),
        "p99_jct_h": round(summary.p99_jct_h, 3),
        "makespan_h": round(summary.makespan_h, 3),
        "utilization": round(summary.utilization, 4),
        "rounds": result.rounds,
        "restarts": result.restarts,
        "policy_solves": result.allocations,
        "wall_s": round(wall_s, 2),
        "tenants": {
            str(tenant): {"held_device_h": round(held, 2), "entitled_device_h": round(entitled, 2)}
            for tenant, (held, entitled) in summary.tenant_share.items()
        },
    }
    if args.json:
        print(json.dumps(figures))
        return 0
    devices = ", ".join(f"{n} {flavor}" for flavor, n in args.cluster.items())
    print(f"{summary.jobs} jobs on {devices}; policy {args.policy}; rounds of {args.round_s:.0f} s")
    print(f"  JCT       avg {summary.avg_jct_h:.2f} h   p50 {summary.p50_jct_h:.2f} h   p99 {summary.p99_jct_h:.2f} h")
    print(f"  makespan  {summary.makespan_h:.2f} h   utilization {summary.utilization:.1%}")
    print(f"  {result.rounds} rounds, {result.allocations} policy solves, {result.restarts} (re)starts, {wall_s:.1f} s")
    for tenant, (held, entitled) in summary.tenant_share.items():
        ratio = f"{held / entitled:.2f}x" if entitled else "-"
        print(f"  tenant {tenant}: {held:.1f} device-h held, {entitled:.1f} entitled ({ratio})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
