"""The ``polychip`` command (``main``): a client of the REST API, and the way to run the control plane here.

Client commands need click, httpx, rich and PyYAML only (``pip install polychip`` without the server
extra); ``up``, ``down``, ``status`` and ``demo`` need the server install (``controlplane.cli.server``).
"""

from __future__ import annotations

from typing import Any


def main(argv: list[str] | None = None) -> Any:
    from controlplane.cli.main import main as run

    return run(argv)
