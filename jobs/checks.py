"""System checks: settings that would otherwise fail only when the first job is admitted."""

from __future__ import annotations

import math
from typing import Any

from django.conf import settings
from django.core.checks import Error, register

from runtime.scheduling.policies import POLICIES

# How the local backend may shape the cross-group link (``runtime.backends.local.LocalBackend``).
LINK_SHAPINGS = ("auto", "netns", "token_bucket")


@register()
def placement_policy_is_known(app_configs: Any, **kwargs: Any) -> list[Error]:
    name = settings.POLYCHIP_PLACEMENT_POLICY
    if name in ("", "none") or name in POLICIES:
        return []
    choices = ", ".join([*POLICIES, "none"])
    return [
        Error(
            f"POLYCHIP_PLACEMENT_POLICY={name!r} is not a placement policy",
            hint=f"set it to one of: {choices}",
            id="polychip.E001",
        )
    ]


@register()
def local_link_is_valid(app_configs: Any, **kwargs: Any) -> list[Error]:
    """The local backend's emulated cross-group link: a speed in Gbit/s (or none) and a shaping."""
    errors = []
    gbit = settings.POLYCHIP_LOCAL_LINK_GBIT
    if gbit is not None and (
        isinstance(gbit, bool) or not isinstance(gbit, int | float) or not math.isfinite(gbit) or gbit <= 0
    ):
        errors.append(
            Error(
                f"POLYCHIP_LOCAL_LINK_GBIT={gbit!r} is not a link speed",
                hint="set it to the cross-group link's speed in Gbit/s, a number > 0 such as 1 or 0.5, "
                "or unset it for no throttling",
                id="polychip.E002",
            )
        )
    shaping = settings.POLYCHIP_LOCAL_LINK_SHAPING
    if shaping not in LINK_SHAPINGS:
        errors.append(
            Error(
                f"POLYCHIP_LOCAL_LINK_SHAPING={shaping!r} is not a way to shape the link",
                hint="set it to auto (netns where the machine allows it, else token_bucket), netns (tc in "
                "network namespaces; needs root) or token_bucket (the ranks' own transport waits)",
                id="polychip.E003",
            )
        )
    return errors
