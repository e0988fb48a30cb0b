"""ASGI entry: Django for HTTP, Channels for WebSockets (session auth, same-origin only)."""

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
# A process that serves requests keeps its PostgreSQL connections in a pool (controlplane/settings.py);
# what it starts later (a test's Celery worker) does not inherit the choice.
_pool_asked = "POLYCHIP_DB_POOL" not in os.environ
if _pool_asked:
    os.environ["POLYCHIP_DB_POOL"] = "1"
try:
    import django

    django.setup(set_prefix=False)
    from controlplane.asgi_handler import SyncChainASGIHandler

    django_asgi_app = SyncChainASGIHandler()
finally:
    if _pool_asked:
        del os.environ["POLYCHIP_DB_POOL"]

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from controlplane.body_limit import BodySizeLimit  # noqa: E402
from controlplane.production import refuse_demo_accounts  # noqa: E402
from controlplane.websocket import SameOriginValidator  # noqa: E402
from frontend.routing import websocket_urlpatterns  # noqa: E402


def _check_at_start() -> None:
    """The start-up check reads the database. ``uvicorn --workers N`` imports this module inside each
    worker's running event loop, where Django refuses synchronous queries: ask from a thread then."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        refuse_demo_accounts()
        return
    with ThreadPoolExecutor(max_workers=1) as thread:
        thread.submit(refuse_demo_accounts).result()


_check_at_start()

application = ProtocolTypeRouter(
    {
        "http": BodySizeLimit(
            django_asgi_app,
            default_limit=settings.POLYCHIP_MAX_REQUEST_BYTES,
            upload_limits=settings.POLYCHIP_UPLOAD_LIMITS,
        ),
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
