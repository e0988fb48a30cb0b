"""ASGI entry: Django for HTTP, Channels for WebSockets (session auth, same-origin only)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402

from controlplane.body_limit import BodySizeLimit  # noqa: E402
from controlplane.production import refuse_demo_accounts  # noqa: E402
from controlplane.websocket import SameOriginValidator  # noqa: E402
from frontend.routing import websocket_urlpatterns  # noqa: E402

refuse_demo_accounts()

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
