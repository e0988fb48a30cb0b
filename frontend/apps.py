from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "frontend"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_out
        from django.db.models.signals import post_delete

        from frontend import access

        user_logged_out.connect(access.on_logout, dispatch_uid="frontend-sockets-logout")
        # By label, not by import: frontend reaches tenants through its services only (make lint).
        post_delete.connect(
            access.on_membership_removed, sender="tenants.Membership", dispatch_uid="frontend-sockets-membership"
        )
