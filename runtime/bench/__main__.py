"""``python -m runtime.bench [--quick] [--json]``: run the benchmark suite on this host and print it."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from runtime.bench.macro import WORKLOADS
from runtime.bench.suite import SuiteResult, run_suite


def format_result(result: SuiteResult) -> str:
    lines = [f"host: {', '.join(f'{k}={v}' for k, v in result.host.items())}"]
    for m in result.micro:
        shown = f"{m.value:.4g} {m.unit}" if m.value is not None else f"skipped ({m.skipped})"
        extra = f"  size {m.detail['size']}" if "size" in m.detail else ""
        lines.append(f"  {m.name:<36} {shown}{extra}")
    for r in result.macro:
        lines.append(f"  {r.job_class:<36} {r.samples_per_s:.1f} samples/s  (batch {r.batch}, {r.steps} timed steps)")
    lines.append(f"wall: {result.wall_s:.1f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short budgets: the whole suite in a few seconds")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--no-micro", action="store_true", help="skip matmul, memory and copy benchmarks")
    parser.add_argument("--no-macro", action="store_true", help="skip the training-step benchmarks")
    parser.add_argument("--class", dest="job_classes", action="append", choices=sorted(WORKLOADS))
    args = parser.parse_args(argv)
    result = run_suite(quick=args.quick, micro=not args.no_micro, macro=not args.no_macro, job_classes=args.job_classes)
    print(json.dumps(result.to_dict()) if args.json else format_result(result), flush=True)  # noqa: T201 (a CLI)
    return 0


if __name__ == "__main__":
    sys.exit(main())
