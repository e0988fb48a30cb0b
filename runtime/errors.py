"""The one shape of a refusal that names what to fix: a field (dotted path) and a message."""

from __future__ import annotations


class FieldError(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
