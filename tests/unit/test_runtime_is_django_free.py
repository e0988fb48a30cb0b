import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = [
    "runtime.balancing",
    "runtime.catalog",
    "runtime.comm",
    "runtime.inventory",
    "runtime.jobspec",
    "runtime.scheduling",
    "runtime.backends.base",
    "runtime.backends.local",
    "runtime.backends.local.supervisor",
    "runtime.backends.local.rank",
    "runtime.worker",
    "runtime.worker.train",
    "runtime.worker.telemetry",
    "runtime.throughput",
    "runtime.bench.suite",
    "runtime.bench.balance",
    "runtime.bench.restart",
    "runtime.backends.local.bench",
]


def test_the_runtime_imports_nothing_of_django():
    # A fresh interpreter: this test process has Django loaded already (pytest-django).
    probe = (
        f"import importlib, sys\nfor m in {MODULES!r}: importlib.import_module(m)\n"
        "print(sorted(name for name in sys.modules if name.split('.')[0] in {'django', 'rest_framework', 'channels',"
        " 'celery'}))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
