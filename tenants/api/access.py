"""Which tenant a request acts for: the token's, or the signed-in user's.

The helpers live in ``tenants.permissions``, the part of tenants that other apps' API views may import
(`make lint`); this module only re-exports them for tenants' own API.
"""

from __future__ import annotations

from tenants.permissions import Access, request_access, request_tenant_id

__all__ = ["Access", "request_access", "request_tenant_id"]
