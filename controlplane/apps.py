from django.apps import AppConfig


class ControlPlaneConfig(AppConfig):
    """The project's own rows: what the Celery workers report for /metrics (controlplane.models)."""

    name = "controlplane"
    verbose_name = "Control plane"
    default_auto_field = "django.db.models.BigAutoField"
