"""Figures of the house (issue 16): how tangled jobs/ is, and how long each test tier takes.

    python bench/house.py [--quick] [--rev REV]

Static figures, read from the source with `ast` (imports inside functions count as imports):
- jobs_services_lines: lines of jobs/services.py (0 if it is gone);
- jobs_import_cycles: import cycles among the modules of jobs/, counted as strongly connected components
  of more than one module in the graph of every import (top level, inside functions, under TYPE_CHECKING);
  a knot of modules that all reach each other counts once, however many circles run through it;
- cross_module_private_imports: sites in jobs, tenants, billing, frontend, controlplane and runtime where a
  module takes a `_private` name of another project module: `from x import _y`, `import x._y`, or
  `m._y` where `m` is bound to a project module by an import (e.g. `services._record`);
- select_for_update_sites_outside_locks: `.select_for_update` call sites in jobs/ outside jobs/locks.py;
- mypy_strict_errors_runtime_billing: `mypy --strict runtime billing` with the project's config and plugins,
  counting the "error:" lines that name a file in runtime/ or billing/.
Test tiers: the whole suite runs once, as `make test` does (its TEST_ENV; PostgreSQL and Redis), with
--junitxml. make_test_s is the wall time of that run; each tier's figure is the sum of its test cases' times
in the JUnit file (pytest's setup + call + teardown per case), grouped by folder: tests/unit → unit,
tests/integration and tests/security → integration, tests/runtime → runtime, tests/e2e → e2e.
--quick: the static figures and the unit tier alone (pytest tests/unit, same environment); the other tier
figures and make_test_s are null.
--rev REV: measure REV instead of this checkout, in a `git worktree` in a temporary folder, with
PYTHONPATH set to it so that its code is the code imported (this .venv has the checkout installed
editable; PYTHONPATH comes first), and its own POLYCHIP_VAR_DIR.
TEST_DATABASE_URL, TEST_BROKER_URL and TEST_CHANNEL_REDIS_URL override the services, as in the Makefile,
so that a measurement can run beside another test run. The load average is printed at start and end.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("controlplane", "tenants", "jobs", "billing", "runtime", "frontend")
PRIVATE_SCAN = ("jobs", "tenants", "billing", "frontend", "controlplane", "runtime")
TIERS = {"unit": "unit", "integration": "integration", "security": "integration", "runtime": "runtime", "e2e": "e2e"}


def say(line: str) -> None:
    print(line, flush=True)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


# --- the source as modules ------------------------------------------------------------------------------


def modules_of(root: Path) -> dict[str, Path]:
    """Every module of the project packages: dotted name → file (migrations left out)."""
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            rel = path.relative_to(root)
            if "migrations" in rel.parts:
                continue
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def resolve_from(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute module name of `from <node.module> import ...` written in `module`."""
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level > 1:
        base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


class Imports:
    """The imports of one module: the modules it names (edges) and what each local name is bound to."""

    def __init__(self, module: str, path: Path, known: dict[str, Path]) -> None:
        self.module = module
        self.tree = ast.parse(path.read_text(), filename=str(path))
        self.is_package = path.name == "__init__.py"
        self.edges: list[tuple[str, bool]] = []  # (imported module, inside a function)
        self.private: list[str] = []  # "importer -> module:name" per site
        self.bindings: dict[str, str] = {}  # local name → project module
        self.deferred: list[set[str]] = []  # per import statement inside a function: the modules it names
        self._known = known
        self._walk(self.tree, in_function=False)

    def _walk(self, node: ast.AST, *, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            before = len(self.edges)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    self._import(alias, in_function=inner)
            elif isinstance(child, ast.ImportFrom):
                self._import_from(child, in_function=inner)
            if inner and len(self.edges) > before:
                self.deferred.append({target for target, _ in self.edges[before:]})
            self._walk(child, in_function=inner)

    def _project(self, name: str) -> bool:
        return name.split(".")[0] in PACKAGES

    def _import(self, alias: ast.alias, *, in_function: bool) -> None:
        if not self._project(alias.name):
            return
        self.edges.append((alias.name, in_function))
        parts = alias.name.split(".")
        for i, part in enumerate(parts[1:], start=1):
            if part.startswith("_") and not part.startswith("__"):
                self.private.append(f"{self.module} -> {'.'.join(parts[:i])}:{part}")
        if alias.asname:
            self.bindings[alias.asname] = alias.name
        else:
            self.bindings[parts[0]] = parts[0]

    def _import_from(self, node: ast.ImportFrom, *, in_function: bool) -> None:
        source = resolve_from(self.module, self.is_package, node)
        if not self._project(source):
            return
        for alias in node.names:
            if alias.name == "*":
                self.edges.append((source, in_function))
                continue
            full = f"{source}.{alias.name}"
            if full in self._known:
                self.edges.append((full, in_function))
                self.bindings[alias.asname or alias.name] = full
            else:
                self.edges.append((source, in_function))
            if alias.name.startswith("_") and not alias.name.startswith("__") and source != self.module:
                self.private.append(f"{self.module} -> {source}:{alias.name}")

    def private_attributes(self) -> list[str]:
        """`m._y` where `m` (or `a.b` in `a.b._y`) is a project module bound by an import of this module."""
        sites: list[str] = []
        for node in ast.walk(self.tree):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            target = self._module_of(node.value)
            if target is not None and target != self.module:
                sites.append(f"{self.module} -> {target}:{node.attr}")
        return sites

    def _module_of(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return self.bindings.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self._module_of(node.value)
            if base is not None and f"{base}.{node.attr}" in self._known:
                return f"{base}.{node.attr}"
        return None


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, list[str]]] = [(start, sorted(graph[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def static_figures(root: Path) -> dict[str, Any]:
    known = modules_of(root)
    parsed = {name: Imports(name, path, known) for name, path in known.items()}
    figures: dict[str, Any] = {}

    services = root / "jobs" / "services.py"
    figures["jobs_services_lines"] = len(services.read_text().splitlines()) if services.exists() else 0
    say(f"jobs/services.py: {figures['jobs_services_lines']} lines")

    jobs_modules = {name for name in known if name == "jobs" or name.startswith("jobs.")}
    graph: dict[str, set[str]] = {name: set() for name in jobs_modules}
    deferred = 0
    for name in jobs_modules:
        for target, _ in parsed[name].edges:
            if target in jobs_modules and target != name:
                graph[name].add(target)
        deferred += sum(1 for targets in parsed[name].deferred if (targets & jobs_modules) - {name})
    knots = [c for c in strongly_connected(graph) if len(c) > 1]
    figures["jobs_import_cycles"] = len(knots)
    say(
        f"jobs/ import cycles (strongly connected components of >1 module, every import counted): {len(knots)}; "
        f"import statements between jobs modules placed inside functions: {deferred}"
    )
    for knot in knots:
        say(f"  cycle among {len(knot)} modules: {', '.join(knot)}")
    figures["jobs_imports_inside_functions"] = deferred

    sites: list[str] = []
    for name, imports in parsed.items():
        if name.split(".")[0] in PRIVATE_SCAN:
            sites += imports.private + imports.private_attributes()
    figures["cross_module_private_imports"] = len(sites)
    say(f"imports of another module's _private name (sites): {len(sites)}")
    for site, count in sorted(Counter(sites).items()):
        say(f"  {site}" + (f" ({count} sites)" if count > 1 else ""))

    lock_sites: list[str] = []
    for name in sorted(jobs_modules):
        if name == "jobs.locks":
            continue
        for node in ast.walk(parsed[name].tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "select_for_update"
            ):
                lock_sites.append(f"{known[name].relative_to(root)}:{node.lineno}")
    figures["select_for_update_sites_outside_locks"] = len(lock_sites)
    say(f"select_for_update call sites in jobs/ outside jobs/locks.py: {len(lock_sites)}")
    for site in lock_sites:
        say(f"  {site}")
    return figures


# --- mypy and the tests ---------------------------------------------------------------------------------


def test_env(root: Path) -> dict[str, str]:
    """The Makefile's TEST_ENV, for the tree at `root`."""
    env = dict(os.environ)
    env.update(
        DATABASE_URL=os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/polychip"),
        CELERY_BROKER_URL=os.environ.get("TEST_BROKER_URL", "redis://127.0.0.1:6379/14"),
        CHANNEL_REDIS_URL=os.environ.get("TEST_CHANNEL_REDIS_URL", "redis://127.0.0.1:6379/15"),
        POLYCHIP_VAR_DIR=str(root / "var" / "test"),
        POLYCHIP_PASSWORD_HASHERS="django.contrib.auth.hashers.MD5PasswordHasher",
        PYTHONPATH=os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])]),
    )
    return env


def mypy_errors(root: Path) -> int:
    cache = root / "var" / "house" / "mypy-cache"  # its own cache: `make lint` may run beside this
    cache.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=str(root), POLYCHIP_VAR_DIR=str(root / "var" / "house"))
    env.pop("DATABASE_URL", None)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--cache-dir", str(cache), "runtime", "billing"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
    )
    lines = [line for line in result.stdout.splitlines() if re.match(r"^(runtime|billing)/[^:]+:\d+: error:", line)]
    by_file = Counter(line.split(":", 1)[0] for line in lines)
    say(
        f"mypy --strict runtime billing: {len(lines)} errors in {len(by_file)} files "
        f"({time.monotonic() - started:.0f} s; mypy says: {result.stdout.strip().splitlines()[-1:]})"
    )
    if result.returncode not in (0, 1):
        say(f"  mypy failed to run (exit {result.returncode}): {result.stderr.strip()[-500:]}")
    return len(lines)


def run_tests(root: Path, paths: list[str], log: Path) -> tuple[float, dict[str, float], dict[str, int]]:
    """Run pytest once; (wall seconds, seconds per tier from the JUnit file, outcome counts)."""
    junit = log.with_suffix(".xml")
    command = [
        str(Path(sys.executable).with_name("pytest")),
        *paths,
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
    ]
    say(f"running pytest {' '.join(command[1:])} in {root} (output in {log})")
    started = time.monotonic()
    with log.open("w") as out:
        result = subprocess.run(command, cwd=root, env=test_env(root), stdout=out, stderr=subprocess.STDOUT)
    wall = time.monotonic() - started
    tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-1:]
    say(f"  pytest exit {result.returncode} after {wall:.1f} s: {tail[0] if tail else ''}")
    tiers: dict[str, float] = {}
    counts = Counter[str]()
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            parts = case.get("classname", "").split(".")
            tier = TIERS.get(parts[1], "other") if len(parts) > 1 and parts[0] == "tests" else "other"
            tiers[tier] = tiers.get(tier, 0.0) + float(case.get("time") or 0)
            counts["tests"] += 1
            for outcome in ("failure", "error", "skipped"):
                if case.find(outcome) is not None:
                    counts[outcome] += 1
    say(
        f"  {counts['tests']} test cases: {counts['failure']} failed, {counts['error']} errors, "
        f"{counts['skipped']} skipped"
    )
    return wall, tiers, {key: counts[key] for key in ("tests", "failure", "error", "skipped")}


def measure(root: Path, quick: bool, logs: Path) -> dict[str, Any]:
    figures = static_figures(root)
    figures["mypy_strict_errors_runtime_billing"] = mypy_errors(root)
    for name in ("unit_tier_s", "integration_tier_s", "runtime_tier_s", "e2e_tier_s", "make_test_s"):
        figures[name] = None
    if quick:
        wall, tiers, counts = run_tests(root, ["tests/unit"], logs / "house-unit.log")
        figures["unit_tier_s"] = round(tiers.get("unit", 0.0), 1)
        say(
            f"unit tier: {figures['unit_tier_s']} s summed over its test cases ({wall:.1f} s wall); "
            "--quick: the other tiers and make_test_s are not run (null)"
        )
    else:
        wall, tiers, counts = run_tests(root, [], logs / "house-all.log")
        figures["make_test_s"] = round(wall, 1)
        for tier in ("unit", "integration", "runtime", "e2e"):
            figures[f"{tier}_tier_s"] = round(tiers.get(tier, 0.0), 1)
        say(
            "tiers, each the sum of its test cases' setup + call + teardown from the JUnit file of the one run: "
            + ", ".join(f"{tier} {seconds:.1f} s" for tier, seconds in sorted(tiers.items()))
            + f"; make_test_s (wall of that run) {wall:.1f} s"
        )
    figures["tests"] = counts
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="static figures and the unit tier only")
    parser.add_argument("--rev", help="measure this git revision, in a temporary worktree")
    args = parser.parse_args()

    load_start = load()
    say(f"load average at start: {load_start} ({os.cpu_count()} CPUs)")
    scratch = Path(tempfile.mkdtemp(prefix="polychip-house-"))
    root = ROOT
    try:
        if args.rev:
            root = scratch / "tree"
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(root), args.rev],
                check=True,
                stdout=subprocess.DEVNULL,
            )
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        say(f"measuring {root} at {commit}" + (" (plus uncommitted changes)" if not args.rev else ""))
        figures = measure(root, args.quick, scratch)
    finally:
        if args.rev and root != ROOT:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(root)], check=False)
        for log in scratch.glob("house-*"):
            label = re.sub(r"[^A-Za-z0-9_.-]", "_", args.rev or "tree")
            keep = Path(tempfile.gettempdir()) / f"{log.stem}-{label}{log.suffix}"
            shutil.copy(log, keep)
        shutil.rmtree(scratch, ignore_errors=True)
    load_end = load()
    say(f"load average at end: {load_end}")
    figures = {"rev": commit, "quick": args.quick, **figures, "loadavg_start": load_start, "loadavg_end": load_end}
    print(json.dumps(figures), flush=True)


if __name__ == "__main__":
    main()
