"""ASGI entry: Django for HTTP, Channels for WebSockets (session auth, same-origin only)."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402  (needs Django set up first)
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from controlplane.production import refuse_demo_accounts  # noqa: E402
from controlplane.websocket import SameOriginValidator  # noqa: E402
from frontend.routing import websocket_urlpatterns  # noqa: E402

refuse_demo_accounts()

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": SameOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)
