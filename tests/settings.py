"""The settings of a test process: production's (controlplane/settings.py), after tests/workers.py has
given a pytest-xdist worker its own Redis databases and var folder.

The change is made in the environment, before the settings read it, so that every process a test starts
(a stack, a rank, the SQLite process of test_bulk) inherits the worker's own services; those processes
load production's settings module, which this one names for them.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.workers import give_worker_its_own_services

if worker := os.environ.get("PYTEST_XDIST_WORKER"):
    give_worker_its_own_services(os.environ, worker, default_var=Path(__file__).resolve().parents[1] / "var")

os.environ["DJANGO_SETTINGS_MODULE"] = "controlplane.settings"

from controlplane.settings import *  # noqa: F403
