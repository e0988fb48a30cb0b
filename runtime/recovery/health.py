"""Device health telemetry: a synthetic model of how accelerators look before they fail.

No real failure telemetry exists in this project, so everything here is *synthetic*: the numbers are
plausible by construction, not measured. The model exists so the failure predictor in
``runtime.recovery.predict`` has histories to learn from and be judged on, and so the local backend
can play a device that degrades and then fails. Figures obtained on these histories say how well a
predictor separates *this generator's* precursors from *this generator's* noise, nothing more.

A device reports one sample per minute with the features in ``FEATURES``:

* ``temperature_c`` follows the load with a few minutes' lag, around a per-device baseline (flavors
  and slots run hotter or cooler), plus slow noise;
* ``power_w`` follows the load, around the device's own idle and full-load draw;
* ``ecc_errors`` and ``pcie_errors`` are counts of corrected errors in that minute (a healthy device
  has a small background rate, different per device);
* ``step_jitter`` is the coefficient of variation of the step time within that minute.

Healthy devices are not flat: jobs change the load level every hour or so (temperature and power
move together, jitter blips at the change), a slow diurnal swing rides on top, and harmless
transients happen (a hot minute or five, a burst of corrected errors, a jittery minute). A naive
threshold therefore raises false alarms, as it would on real fleets.

A failing device degrades for 20 to 90 minutes before it fails: the temperature ramps up without a
matching rise in power (a cooling fault), the ECC rate climbs, PCIe errors come in bursts, the
jitter grows, often several at once, with a strength that varies and is sometimes faint. About 15%
of failures are sudden and have no precursor at all, so no honest predictor reaches full recall.

One definition serves both uses: ``generate_histories`` and ``DeviceTelemetrySource`` run the same
``DeviceSimulator`` minute by minute with the same ``Degradation`` functions. The degradation draws
from its own random stream, so a degrading device's samples are the same as its healthy twin's until
the degradation starts, and a sudden failure's samples are exactly the healthy ones.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

FEATURES: tuple[str, ...] = ("temperature_c", "power_w", "ecc_errors", "pcie_errors", "step_jitter")

# Failing modes as generate_histories draws them, with their shares among failing devices.
FAILURE_MODE_SHARES: dict[str, float] = {
    "thermal": 0.15,
    "ecc": 0.15,
    "pcie": 0.15,
    "jitter": 0.15,
    "mixed": 0.25,
    "sudden": 0.15,
}
MODES: tuple[str, ...] = ("healthy", *FAILURE_MODE_SHARES)

# The components a degradation is made of; a mode names one, "mixed" draws two or three, "sudden" none.
COMPONENTS: tuple[str, ...] = ("thermal", "ecc", "pcie", "jitter")

# How long the precursor lasts before the failure, in minutes (the 20-90 minutes).
MIN_LEAD_MIN = 20.0
MAX_LEAD_MIN = 90.0


@dataclass(frozen=True)
class DeviceHistory:
    """One device's per-minute samples (``FEATURES`` order) up to its failure or the end of the record.

    ``fail_at`` is the minute index at which the device fails; the samples stop just before it, so
    ``len(samples) == fail_at`` for a failing device. ``None`` means the device did not fail within
    the record. ``precursor_from`` is the first minute the degradation shows in the samples (None for
    healthy devices and sudden failures): the ground truth of what a predictor could have seen, kept
    to say how much of the recall was within reach.
    """

    samples: list[tuple[float, ...]]
    fail_at: int | None
    mode: str
    precursor_from: int | None = None


@dataclass(frozen=True)
class DeviceBaseline:
    """What a healthy device looks like: its own operating point, noise and background error rates.

    Devices differ (a hot slot, a power-hungry flavor, a chip with a few more corrected errors than
    its neighbours), which is why a fixed absolute threshold works poorly and why the predictor gets
    windows rather than single readings.
    """

    idle_temp_c: float
    temp_rise_c: float  # from idle to full load
    idle_power_w: float
    full_power_w: float
    ecc_rate: float  # corrected ECC errors per minute, healthy background
    pcie_rate: float  # PCIe (replayed/corrected) errors per minute, healthy background
    jitter_cv: float  # healthy step-time coefficient of variation
    spike_rate: float  # harmless transients per minute
    diurnal_amplitude: float  # load swing over a day, as a share of full load
    diurnal_phase: float  # radians
    job_change_rate: float  # load level changes per minute


def draw_baseline(rng: random.Random) -> DeviceBaseline:
    """A plausible device: the ranges span the common accelerator flavors, not one model."""
    idle_power = rng.uniform(60.0, 130.0)
    return DeviceBaseline(
        idle_temp_c=rng.uniform(28.0, 42.0),
        temp_rise_c=rng.uniform(22.0, 42.0),
        idle_power_w=idle_power,
        full_power_w=idle_power + rng.uniform(220.0, 600.0),
        ecc_rate=math.exp(rng.uniform(math.log(0.002), math.log(0.08))),
        pcie_rate=math.exp(rng.uniform(math.log(0.001), math.log(0.03))),
        jitter_cv=rng.uniform(0.01, 0.05),
        spike_rate=rng.uniform(0.003, 0.02),
        diurnal_amplitude=rng.uniform(0.03, 0.12),
        diurnal_phase=rng.uniform(0.0, 2.0 * math.pi),
        job_change_rate=1.0 / rng.uniform(40.0, 120.0),
    )


@dataclass(frozen=True)
class DegradationEffect:
    """What a degradation adds to a minute's healthy reading."""

    temperature_c: float = 0.0
    power_w: float = 0.0
    ecc_rate: float = 0.0  # extra expected ECC errors this minute
    pcie_burst_chance: float = 0.0  # chance of a PCIe error burst this minute
    pcie_burst_size: float = 0.0  # expected size of such a burst
    jitter_factor: float = 1.0  # multiplies the step-time CV


@dataclass(frozen=True)
class Degradation:
    """A precursor that starts at ``onset`` and ends in a failure at ``fail_at`` (emulated minutes).

    ``strengths`` maps components of ``COMPONENTS`` to 0..1; ``shape`` > 1 makes the ramp accelerate
    towards the failure (most of the signal comes late), which is how wear-out usually looks.
    """

    mode: str
    onset: float
    fail_at: float
    strengths: dict[str, float] = field(default_factory=dict)
    shape: float = 1.5

    def progress(self, minute: float) -> float:
        """0 before the onset, rising to 1 at the failure."""
        if minute <= self.onset:
            return 0.0
        span = max(self.fail_at - self.onset, 1e-9)
        return min(1.0, (minute - self.onset) / span)

    def effect(self, minute: float, full_power_w: float) -> DegradationEffect:
        """The offsets this degradation applies at ``minute``; nothing before the onset or when sudden."""
        p = self.progress(minute)
        if p <= 0.0 or not self.strengths:
            return DegradationEffect()
        ramp = p**self.shape
        thermal = self.strengths.get("thermal", 0.0)
        ecc = self.strengths.get("ecc", 0.0)
        pcie = self.strengths.get("pcie", 0.0)
        jitter = self.strengths.get("jitter", 0.0)
        # A failing fan or pump: temperature climbs, power barely moves (leakage adds a little), and
        # near the end the chip throttles, which shows as jitter.
        throttling = max(0.0, (p - 0.7) / 0.3)
        return DegradationEffect(
            temperature_c=thermal * 28.0 * ramp,
            power_w=thermal * 0.04 * full_power_w * ramp,
            ecc_rate=ecc * 6.0 * ramp,
            pcie_burst_chance=pcie * 0.45 * p,
            pcie_burst_size=2.0 + pcie * 14.0 * ramp,
            jitter_factor=1.0 + jitter * 3.5 * ramp + thermal * 0.8 * throttling,
        )


def make_degradation(
    mode: str, onset: float, fail_at: float, rng: random.Random, *, strength: float | None = None
) -> Degradation:
    """The degradation of a failure ``mode`` between ``onset`` and ``fail_at``.

    ``strength`` None draws each component's strength (some faint, most clear); a number sets all
    of them, which is what a demo or a test wants. "mixed" draws two or three components.
    """
    if mode not in FAILURE_MODE_SHARES:
        raise ValueError(f"unknown failure mode {mode!r}; expected one of {sorted(FAILURE_MODE_SHARES)}")
    if fail_at <= onset:
        raise ValueError(f"fail_at ({fail_at}) must come after onset ({onset})")
    if mode == "sudden":
        components: list[str] = []
    elif mode == "mixed":
        components = rng.sample(COMPONENTS, rng.choice((2, 2, 3)))
    else:
        components = [mode]
    strengths = {name: strength if strength is not None else rng.uniform(0.1, 1.0) for name in components}
    return Degradation(mode=mode, onset=onset, fail_at=fail_at, strengths=strengths, shape=rng.uniform(1.0, 2.5))


def poisson(rng: random.Random, mean: float) -> int:
    """A Poisson draw without numpy (Knuth for small means, a rounded normal for large ones)."""
    if mean <= 0.0:
        return 0
    if mean > 30.0:
        return max(0, round(rng.gauss(mean, math.sqrt(mean))))
    limit, k, product = math.exp(-mean), 0, rng.random()
    while product > limit:
        k += 1
        product *= rng.random()
    return k


class DeviceSimulator:
    """Produces a device's samples minute by minute: the one definition of the telemetry model.

    ``noise_rng`` drives everything a healthy device does; ``fault_rng`` drives only what the
    degradation adds, so the same ``noise_rng`` seed gives the same healthy background with or
    without a degradation.
    """

    def __init__(self, baseline: DeviceBaseline, noise_rng: random.Random, fault_rng: random.Random) -> None:
        self.baseline = baseline
        self.degradation: Degradation | None = None
        self.minute = 0  # the index of the next sample
        self._noise = noise_rng
        self._fault = fault_rng
        self._job_level = noise_rng.uniform(0.55, 1.0)
        self._temperature = baseline.idle_temp_c + baseline.temp_rise_c * self._job_level
        self._temp_noise = 0.0
        self._power_noise = 0.0
        self._hot_spike_c = 0.0
        self._jitter_spike_minutes = 0

    def load(self, minute: int) -> float:
        """The share of full load at ``minute``: the current job's level plus a diurnal swing."""
        diurnal = self.baseline.diurnal_amplitude * math.sin(
            2.0 * math.pi * minute / 1440.0 + self.baseline.diurnal_phase
        )
        return min(1.05, max(0.05, self._job_level + diurnal))

    def step(self) -> tuple[float, ...]:
        """The next minute's sample, in ``FEATURES`` order."""
        b, rng, minute = self.baseline, self._noise, self.minute
        jitter_cv = b.jitter_cv * math.exp(rng.gauss(0.0, 0.2))
        if rng.random() < b.job_change_rate:  # a new job or phase: load moves, steps are uneven for a minute
            self._job_level = rng.uniform(0.35, 1.0)
            jitter_cv *= rng.uniform(1.5, 3.0)
        load = self.load(minute)
        # Temperature approaches the load's equilibrium with a ~4-minute time constant.
        target = b.idle_temp_c + b.temp_rise_c * load
        self._temperature += (target - self._temperature) / 4.0
        self._temp_noise = 0.85 * self._temp_noise + rng.gauss(0.0, 0.45)
        self._power_noise = 0.6 * self._power_noise + rng.gauss(0.0, 0.015)
        ecc = poisson(rng, b.ecc_rate)
        pcie = poisson(rng, b.pcie_rate)
        if rng.random() < b.spike_rate:  # a harmless transient of one kind
            kind = rng.randrange(4)
            if kind == 0:
                self._hot_spike_c = max(self._hot_spike_c, rng.uniform(4.0, 14.0))
            elif kind == 1:
                ecc += poisson(rng, rng.uniform(2.0, 10.0))
            elif kind == 2:
                pcie += poisson(rng, rng.uniform(2.0, 12.0))
            else:
                self._jitter_spike_minutes = rng.randint(1, 3)
        if self._jitter_spike_minutes > 0:
            jitter_cv *= rng.uniform(2.0, 4.0)
            self._jitter_spike_minutes -= 1
        temperature = self._temperature + self._temp_noise + self._hot_spike_c
        self._hot_spike_c *= 0.5 if self._hot_spike_c > 0.5 else 0.0
        power = (b.idle_power_w + (b.full_power_w - b.idle_power_w) * load) * (1.0 + self._power_noise)

        if self.degradation is not None:
            effect = self.degradation.effect(minute, b.full_power_w)
            temperature += effect.temperature_c
            power += effect.power_w
            ecc += poisson(self._fault, effect.ecc_rate)
            if effect.pcie_burst_chance > 0.0 and self._fault.random() < effect.pcie_burst_chance:
                pcie += poisson(self._fault, effect.pcie_burst_size)
            jitter_cv *= effect.jitter_factor

        self.minute += 1
        return (temperature, max(0.0, power), float(ecc), float(pcie), jitter_cv)

    def failed_by(self, minute: float) -> bool:
        """Whether the degradation, if any, has reached its failure by ``minute``."""
        return self.degradation is not None and minute >= self.degradation.fail_at


def _draw_failure_mode(rng: random.Random) -> str:
    modes = list(FAILURE_MODE_SHARES)
    return rng.choices(modes, weights=[FAILURE_MODE_SHARES[m] for m in modes])[0]


def generate_histories(count: int, *, seed: int, minutes: int = 240, failure_share: float = 0.4) -> list[DeviceHistory]:
    """``count`` synthetic device histories, deterministic in ``seed``.

    About ``failure_share`` of them fail, at a minute between half the record and its end, after a
    precursor of 20-90 minutes (none for sudden failures); the others stay healthy for ``minutes``.
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    if minutes < 2 * int(MAX_LEAD_MIN):
        raise ValueError(f"minutes must be at least {2 * int(MAX_LEAD_MIN)} so a precursor fits before a failure")
    if not 0.0 <= failure_share <= 1.0:
        raise ValueError("failure_share must be within 0..1")
    rng = random.Random(seed)
    histories: list[DeviceHistory] = []
    for _ in range(count):
        device_seed = rng.getrandbits(64)
        simulator = DeviceSimulator(
            draw_baseline(random.Random(device_seed)),
            noise_rng=random.Random(device_seed + 1),
            fault_rng=random.Random(device_seed + 2),
        )
        fail_at: int | None = None
        precursor_from: int | None = None
        mode = "healthy"
        if rng.random() < failure_share:
            mode = _draw_failure_mode(rng)
            fail_at = rng.randint(minutes // 2, minutes)
            onset = fail_at - rng.uniform(MIN_LEAD_MIN, MAX_LEAD_MIN)
            simulator.degradation = make_degradation(mode, onset, float(fail_at), rng)
            precursor_from = None if mode == "sudden" else math.floor(onset) + 1  # progress > 0 from here
        length = fail_at if fail_at is not None else minutes
        samples = [simulator.step() for _ in range(length)]
        histories.append(DeviceHistory(samples=samples, fail_at=fail_at, mode=mode, precursor_from=precursor_from))
    return histories


class DeviceTelemetrySource:
    """The live telemetry of one emulated device, for a rank process of the local backend.

    Time is compressed: ``minutes_per_second`` emulated minutes pass per real second, so a 30-minute
    degradation plays out in seconds. Emulated minute 0 begins at ``origin_s`` (by default the
    ``now_s`` of the first call). Samples are produced in order and the last ``keep_minutes`` are
    kept, so asking twice within a minute gives the same reading and ``window`` gives the recent
    history the predictor needs. After the failure the source keeps reporting (a dead device's
    telemetry is the caller's business); ``failed`` says when that point is reached.
    """

    def __init__(
        self,
        seed: int,
        *,
        minutes_per_second: float = 1.0,
        baseline: DeviceBaseline | None = None,
        origin_s: float | None = None,
        keep_minutes: int = 240,
    ) -> None:
        if not minutes_per_second > 0.0 or not math.isfinite(minutes_per_second):
            raise ValueError(f"minutes_per_second must be a positive number, got {minutes_per_second}")
        if keep_minutes < 1:
            raise ValueError("keep_minutes must be >= 1")
        self.minutes_per_second = minutes_per_second
        self.origin_s = origin_s
        self._keep = keep_minutes
        self._fault_rng = random.Random(f"{seed}:fault")
        self._simulator = DeviceSimulator(
            baseline if baseline is not None else draw_baseline(random.Random(f"{seed}:baseline")),
            noise_rng=random.Random(f"{seed}:noise"),
            fault_rng=self._fault_rng,
        )
        self._recent: list[tuple[float, ...]] = []

    @property
    def baseline(self) -> DeviceBaseline:
        return self._simulator.baseline

    @property
    def degradation(self) -> Degradation | None:
        return self._simulator.degradation

    def minute_at(self, now_s: float) -> float:
        """The emulated minute (fractional) at real time ``now_s``."""
        if self.origin_s is None:
            self.origin_s = now_s
        return max(0.0, (now_s - self.origin_s) * self.minutes_per_second)

    def _advance(self, now_s: float) -> int:
        """Produce samples up to the current minute; return its index."""
        current = int(self.minute_at(now_s))
        while self._simulator.minute <= current:
            self._recent.append(self._simulator.step())
        if len(self._recent) > self._keep:
            del self._recent[: len(self._recent) - self._keep]
        return current

    def sample(self, now_s: float) -> dict[str, float]:
        """The current emulated minute's reading, keyed by ``FEATURES``.

        Asking about an earlier time than before gives the latest minute produced: samples only move
        forward, as real telemetry does.
        """
        self._advance(now_s)
        return dict(zip(FEATURES, self._recent[-1], strict=True))

    def window(self, now_s: float, minutes: int) -> list[tuple[float, ...]]:
        """The last ``minutes`` samples up to and including the current minute (fewer early on)."""
        self._advance(now_s)
        return list(self._recent[-minutes:])

    def start_degradation(
        self, mode: str, minutes_to_failure: float, now_s: float, *, strength: float | None = 1.0
    ) -> Degradation:
        """Begin a precursor of ``mode`` now; the device fails ``minutes_to_failure`` emulated minutes later.

        ``strength`` defaults to a clear degradation (1.0), which is what a demo wants; None draws it
        as ``generate_histories`` does.
        """
        if not minutes_to_failure > 0.0:
            raise ValueError("minutes_to_failure must be > 0")
        self._advance(now_s)
        onset = self.minute_at(now_s)
        degradation = make_degradation(mode, onset, onset + minutes_to_failure, self._fault_rng, strength=strength)
        self._simulator.degradation = degradation
        return degradation

    def failed(self, now_s: float) -> bool:
        """True once the degradation has reached its failure time."""
        return self._simulator.failed_by(self.minute_at(now_s))
