"""The Celery app; tasks live in each app's ``tasks.py`` and take ids, never objects."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("polychip")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
