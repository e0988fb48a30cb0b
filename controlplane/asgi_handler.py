"""Django's ASGI handler with the middleware chain run synchronously, entered once per request."""

from __future__ import annotations

from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


class SyncChainASGIHandler(ASGIHandler):
    """Loads the middleware chain for synchronous code and runs it, view included, in the request's thread.

    Django's own ASGI handler loads the chain for async code. Every sync-only middleware (WhiteNoise,
    ours) then hops from the request's thread back to the event loop, and every ``MiddlewareMixin`` hook
    that runs in async mode hops from the loop to a thread; about eight crossings a request here, each
    one waiting its turn on a loop that serves every other connection. Under 16 clients that waiting,
    not the work, made most of an API request's time. Our views are synchronous, so one crossing is
    enough. Streaming bodies (log follow, long-poll wait) are async iterators that the handler still
    consumes on the loop, as before.
    """

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)
        # The request's thread: ASGIHandler opens a ThreadSensitiveContext per request.
        chain: Any = self._middleware_chain
        self._middleware_chain: Any = sync_to_async(chain, thread_sensitive=True)
