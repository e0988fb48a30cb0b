"""Backends run a placed job on real machinery: ``local`` (processes here) or ``kubernetes``."""

from runtime.backends.base import Backend, LaunchRequest, Observation, Phase, RankPlacement, RankState

__all__ = ["Backend", "LaunchRequest", "Observation", "Phase", "RankPlacement", "RankState"]
