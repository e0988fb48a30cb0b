from django.apps import AppConfig


class JobsConfig(AppConfig):
    name = "jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Quotas name flavors, which the pool (this app) knows; tenants may not import jobs.
        from jobs import checks, services  # noqa: F401  (checks registers itself)
        from tenants.services import register_flavor_source

        register_flavor_source(services.known_flavors)
