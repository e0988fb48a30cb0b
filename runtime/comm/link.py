"""How the local backend slows the cross-group link (torch-free: worker configs carry it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["EMULATION_MODES", "LinkEmulation"]

EMULATION_MODES = ("none", "token_bucket", "netns")


@dataclass(frozen=True)
class LinkEmulation:
    """``none``; ``token_bucket``: each rank's cross-group sends wait in ``runtime.comm.transport``'s
    ``LinkThrottle``; ``netns``: real shaping, ``tc`` on the veth of each group's network namespace,
    set up by the local backend before the ranks start (the ranks then need nothing)."""

    mode: str = "none"
    gbit: float = 0.0

    def __post_init__(self) -> None:
        if self.mode not in EMULATION_MODES:
            raise ValueError(f"link.mode: {self.mode!r}; use one of {', '.join(EMULATION_MODES)}")
        if self.mode != "none" and not self.gbit > 0:
            raise ValueError(f"link.gbit: must be > 0 when the link is emulated, got {self.gbit}")

    def to_json(self) -> dict[str, Any]:
        return {"mode": self.mode, "gbit": self.gbit}

    @classmethod
    def from_json(cls, raw: Any) -> LinkEmulation:
        if raw is None:
            return cls()
        if not isinstance(raw, dict) or set(raw) - {"mode", "gbit"}:
            raise ValueError('link: expected {"mode": "none|token_bucket|netns", "gbit": number}')
        gbit = raw.get("gbit", 0.0)
        if isinstance(gbit, bool) or not isinstance(gbit, int | float):
            raise ValueError(f"link.gbit: must be a number of Gbit/s, got {gbit!r}")
        return cls(str(raw.get("mode", "none")), float(gbit))
