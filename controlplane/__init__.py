"""The Django project: settings from the environment, URLs, ASGI router and the Celery app."""

from controlplane.celery import app as celery_app

__all__ = ["celery_app"]
