from django.apps import AppConfig
from django.db.models.signals import post_migrate


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Quotas name flavors, which the pool (this app) knows, and budgets count the devices jobs
        # hold now; neither tenants nor billing may import jobs, so jobs registers its sources there.
        from billing.services import UsageSource, register_usage_source
        from jobs import checks, services  # noqa: F401  (checks registers itself)
        from jobs.locks import ensure_admission_lock_row
        from tenants.services import register_flavor_source

        register_flavor_source(services.known_flavors)
        register_usage_source(UsageSource(open_usage=services.open_usage, allocated_ms=services.allocated_ms))
        post_migrate.connect(ensure_admission_lock_row, sender=self, dispatch_uid="jobs.admission_lock_row")
