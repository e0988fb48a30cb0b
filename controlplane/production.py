"""What a production-like start refuses: the accounts `polychip demo` made (known to whoever ran it).

A production-like setting is `POLYCHIP_ENV=production`, or `DEBUG` off with `DATABASE_URL` set
(`settings.PRODUCTION_LIKE`). The ASGI server and the Celery worker and beat call
`refuse_demo_accounts` as they start, so none of them serves while a demo account exists.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tenants import services as tenants


def refuse_demo_accounts() -> None:
    if not settings.PRODUCTION_LIKE:
        return
    names = tenants.demo_usernames()
    if names:
        raise ImproperlyConfigured(
            f"refusing to start a production-like Polychip while demo accounts exist: {', '.join(names)}. "
            "Delete them (python manage.py shell, or the admin console with POLYCHIP_ENV unset), or run the "
            "demo on the embedded default instead (unset DATABASE_URL and POLYCHIP_ENV)."
        )
