"""Device emulation: a slower chip is a process whose steps are padded to take longer.

Only the local backend knows about this. The worker exposes a generic step hook; the hook built
here sleeps so that a step of ``b`` samples lasts at least ``b * sample_time_ms / 1000 / speed``
seconds, where ``speed`` is the flavor's ``relative_speed`` (1.0 = the reference chip). When the
real compute already takes longer, nothing is added.

The speed can change while a job runs (to emulate throttling or a noisy neighbour): write a float
to ``RUN_DIR/speed.rank<N>`` (``LocalBackend.set_speed`` does it atomically). The hook re-reads that
file at most every ``reread_interval_s`` (0.5 s); a missing file keeps the current speed and an
unreadable or non-positive value is ignored with one warning.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

from runtime.worker.config import StepHook, StepInfo

REREAD_INTERVAL_S = 0.5


def padding_seconds(samples: int, sample_time_ms: float, relative_speed: float, elapsed_s: float) -> float:
    """How long to sleep so the step lasts its emulated time; 0 when it already did."""
    if relative_speed <= 0:
        raise ValueError(f"relative_speed must be > 0, got {relative_speed}")
    target = samples * sample_time_ms / 1000.0 / relative_speed
    return max(0.0, target - elapsed_s)


def parse_speed(text: str) -> float | None:
    """A usable relative speed from a speed file's content, or None."""
    try:
        value = float(text.strip())
    except ValueError:
        return None
    if not math.isfinite(value) or value <= 0:
        return None
    return value


class SpeedSource:
    """The current relative speed: the initial value, overridden by the speed file when present."""

    def __init__(
        self,
        initial: float,
        path: Path | None = None,
        reread_interval_s: float = REREAD_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if initial <= 0 or not math.isfinite(initial):
            raise ValueError(f"relative speed must be a positive number, got {initial}")
        self._speed = initial
        self._path = path
        self._interval = reread_interval_s
        self._clock = clock
        self._next_read = float("-inf")
        self._warned = False

    def current(self) -> float:
        if self._path is not None and self._clock() >= self._next_read:
            self._next_read = self._clock() + self._interval
            self._reread(self._path)
        return self._speed

    def _reread(self, path: Path) -> None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            self._warn(f"cannot read {path}: {exc}")
            return
        value = parse_speed(text)
        if value is None:
            self._warn(f"{path}: {text.strip()[:40]!r} is not a positive number; keeping speed {self._speed}")
        else:
            self._speed = value

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            print(f"local backend: {message}", file=sys.stderr, flush=True)  # noqa: T201 (stderr is this process's log, which the supervisor shows)


def make_padding_hook(
    sample_time_ms: float,
    speed: SpeedSource,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> StepHook:
    """A worker step hook that pads each step to its emulated duration."""
    if sample_time_ms < 0:
        raise ValueError(f"sample_time_ms must be >= 0, got {sample_time_ms}")

    def pad(info: StepInfo) -> None:
        delay = padding_seconds(info.samples, sample_time_ms, speed.current(), clock() - info.started_at)
        if delay > 0:
            sleep(delay)

    return pad
