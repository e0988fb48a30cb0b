"""System checks: settings that would otherwise fail only when the first job is admitted."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, register

from runtime.scheduling.policies import POLICIES


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
