"""The errors that use cases raise when they refuse a request; plain Python, no Django and no DRF.

An app's services raise these (or their own subclasses, keeping their names); ``controlplane.errors``
answers each over HTTP, once, in the project's error shape ``{"error": {"code", "field"?, "message"}}``:

=============  ======  =====================================================================
class          status  meaning
=============  ======  =====================================================================
``Invalid``    400     the request itself is wrong; ``field`` names what to fix
``Forbidden``  403     the caller may not do this (wrong credentials for the thing named)
``NotFound``   404     no such object, or not one the caller may see: the two answer alike
``Conflict``   409     the request clashes with what exists or with the state things are in
(other)        400     a ``DomainError`` of no kind above is a refusal of the request
=============  ======  =====================================================================

The most specific of these in an error's class hierarchy decides: an app's ``Refused`` base may be a
plain ``DomainError`` while its ``Conflict`` subclass is also ``domain.Conflict``. ``code`` is a short
machine-readable word (a class default, or per instance); ``message`` says what went wrong and how to fix
it; ``field`` is the dotted path of the input at fault, or ``None``.
"""

from __future__ import annotations

__all__ = ["Conflict", "DomainError", "Forbidden", "Invalid", "NotFound"]


class DomainError(Exception):
    code: str = "invalid"
    field: str | None = None
    message: str = ""

    def __init__(self, message: str, *, field: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if field is not None:
            self.field = field
        if code is not None:
            self.code = code


class Invalid(DomainError):
    """The request itself is wrong (HTTP 400); ``field`` names what to fix."""

    code = "invalid"


class Forbidden(DomainError):
    """The caller may not do this (HTTP 403)."""

    code = "forbidden"


class NotFound(DomainError):
    """No such object, or not one the caller may see (HTTP 404)."""

    code = "not_found"


class Conflict(DomainError):
    """The request clashes with what exists, or with the state things are in (HTTP 409)."""

    code = "conflict"
