"""Sign-in lockout (django-axes): too many wrong passwords lock the account and the address out.

Axes counts failed sign-ins per username and per client address (each on its own) in the database,
so every server process sees the same count; after ``AXES_FAILURE_LIMIT`` failures the sign-in
forms of the portal and the admin answer 429 until ``AXES_COOLOFF_TIME`` has passed, even for the
right password. A success resets the account's count.
"""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.http import HttpRequest


class LockoutBackend(AxesStandaloneBackend):
    """Axes' check, for sign-ins that come with a request: the portal's and the admin's forms.

    A sign-in without a request (a management command, a test client's ``login``) has no address to
    count and no form to answer; it goes on to the next backend, as it did before axes.
    """

    def authenticate(
        self, request: HttpRequest | None, username: str | None = None, password: str | None = None, **kwargs: Any
    ) -> Any:
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)
