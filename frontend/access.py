"""Whether an open WebSocket may still hear its tenant's events, and how it learns it may not.

A socket is checked at connect, and again before each event it is sent: the session it was opened
with must still exist and be the same user's, and the user must still belong to the tenant. Signing
out and leaving the tenant also tell the user's open sockets at once (``access_revoked``), so that
a socket closes even while no event comes.
"""

from __future__ import annotations

import logging
from importlib import import_module
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.db import transaction

from tenants import services as tenants

log = logging.getLogger(__name__)


def user_group(user_id: int) -> str:
    return f"user-{user_id}-sockets"


def still_allowed(*, session_key: str | None, user_id: int, tenant_id: int) -> bool:
    if not session_key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    if str(store.load().get(SESSION_KEY)) != str(user_id):
        return False  # signed out, expired, or the session was given to someone else
    return tenants.role_in_tenant(user_id=user_id, tenant_id=tenant_id) is not None


def tell_sockets(user_id: int, **revoked: Any) -> None:
    """Once the caller's transaction commits, tell the user's open sockets what was revoked
    (``session_key`` or ``tenant_id``). Best effort: the per-event check is the backstop."""

    def send() -> None:
        layer = get_channel_layer()
        if layer is None:
            return
        try:
            async_to_sync(layer.group_send)(user_group(user_id), {"type": "access.revoked", **revoked})
        except Exception:
            log.exception("could not tell user %s's sockets that access was revoked", user_id)

    transaction.on_commit(send)


def on_logout(sender: Any, request: Any, user: Any, **_: Any) -> None:
    if user is not None and request is not None and request.session.session_key:
        tell_sockets(user.pk, session_key=request.session.session_key)


def on_membership_removed(sender: Any, instance: Any, **_: Any) -> None:
    tell_sockets(instance.user_id, tenant_id=instance.tenant_id)
