from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from jobs import services
from jobs.backends import get_backend
from runtime.bench.suite import benchmark_entries


class Command(BaseCommand):
    help = (
        "Benchmark each flavor of the pool on the local backend (its emulation applied) and store the "
        "samples/s per job class in the throughput table. Entries learned from real steps are kept."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--flavor", action="append", help="only this flavor (repeatable); default: every flavor")
        parser.add_argument("--full", action="store_true", help="longer benchmarks (default: quick, a few s each)")
        parser.add_argument("--over-measured", action="store_true", help="also replace entries learned from real steps")

    def handle(self, *args: Any, **options: Any) -> None:
        from runtime.backends.local import LocalBackend

        backend = get_backend()
        if not isinstance(backend, LocalBackend):
            raise CommandError(f"seed_throughput benchmarks on the local backend; this one is {backend.name!r}")
        in_pool = services.known_flavors()
        if not in_pool:
            raise CommandError("the pool has no flavors; run load_pool first")
        wanted = set(options["flavor"] or in_pool)
        unknown = sorted(wanted - in_pool)
        if unknown:
            raise CommandError(f"--flavor {unknown[0]!r} is not in the pool; choose from {', '.join(sorted(in_pool))}")
        no_profile = sorted(wanted - set(backend.profiles))
        for flavor in no_profile:
            self.stderr.write(f"{flavor}: no local profile in the pool file, skipped")
        flavors = sorted(wanted - set(no_profile))
        try:
            results = backend.benchmark_flavors(flavors, quick=not options["full"])
        except (RuntimeError, ValueError) as exc:
            raise CommandError(str(exc)) from None
        entries = [entry for flavor in flavors for entry in benchmark_entries(flavor, results[flavor])]
        counts = services.store_benchmarks(entries, over_measured=options["over_measured"])
        for entry in entries:
            self.stdout.write(f"{entry.flavor:<14} {entry.job_class:<18} {entry.samples_per_s:10.1f} samples/s")
        self.stdout.write(
            f"throughput: {counts['stored']} entries stored, {counts['kept']} measured entries kept, "
            f"{len(flavors)} flavors benchmarked"
        )
