"""The Django project: settings from the environment, URLs, ASGI router and the Celery app.

Importing the package loads nothing: the ``polychip`` CLI (``controlplane.cli``) lives here and must
start without Django or Celery. The Celery app is ``controlplane.celery.app`` (``celery -A
controlplane`` finds it there); the modules that send tasks import it, and ``celery_app`` stays
available on the package for those that look for it by Celery's convention.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "celery_app":
        from controlplane.celery import app

        return app
    raise AttributeError(f"module 'controlplane' has no attribute {name!r}")
