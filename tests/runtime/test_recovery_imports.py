"""What the package root of runtime.recovery imports, seen from a fresh interpreter (a process: this tier).

The store and the advisor are what the control plane reads; they must not pull torch or boto3 into it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_root_store_and_advisor_import_neither_torch_nor_boto3():
    probe = (
        "import sys, runtime.recovery, runtime.recovery.store, runtime.recovery.advisor\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'boto3', 'botocore', 'django'}))"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
