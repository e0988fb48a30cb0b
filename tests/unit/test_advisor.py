"""Young/Daly checkpoint-interval advice against hand-computed numbers.

Daly's interval written out: sqrt(2CM) * (1 + sqrt(C/2M)/3 + (C/2M)/9) - C
                           = sqrt(2CM) + C/3 + (C/9) * sqrt(C/2M) - C,
which is how the expected values below were worked out.
"""

from __future__ import annotations

import math
import re

import pytest

from runtime.recovery.advisor import (
    MAX_INTERVAL_STEPS,
    advise,
    advise_for_job,
    daly_interval_s,
    job_mtbf_s,
    young_interval_s,
)


@pytest.mark.parametrize(
    ("cost", "mtbf", "step", "young", "daly", "weights_every"),
    [
        # sqrt(2*10*5000) = 316.2278; + 10/3 + (10/9)*sqrt(0.001) - 10 = 309.5962
        (10.0, 5000.0, 1.0, 316.2277660, 309.5962357, 310),
        (10.0, 5000.0, 0.5, 316.2277660, 309.5962357, 619),  # 619.19 steps
        (10.0, 5000.0, 2.0, 316.2277660, 309.5962357, 155),  # 154.80 steps
        # sqrt(2*50*100) = 100; + 50/3 + (50/9)*0.5 - 50 = 69.4444
        (50.0, 100.0, 1.0, 100.0, 69.4444444, 69),
        # C = 2M: past the expansion's range, Daly's interval is the MTBF.
        (200.0, 100.0, 1.0, 200.0, 100.0, 100),
        (300.0, 100.0, 10.0, 244.9489743, 100.0, 10),
        # A free save: checkpoint every step.
        (0.0, 1000.0, 1.0, 0.0, 0.0, 1),
        # 4.1 ms stall, 3 devices at 0.01 failures per device-hour (M = 120000 s):
        # sqrt(984) = 31.36877; + 0.0013667 + 0.00045556*sqrt(1.70833e-8) - 0.0041 = 31.36604
        (0.0041, 120000.0, 0.05, 31.3687743, 31.3660410, 627),
    ],
)
def test_young_and_daly_against_hand_computed_numbers(
    cost: float, mtbf: float, step: float, young: float, daly: float, weights_every: int
):
    advice = advise(cost, mtbf, step)
    assert advice.young_s == pytest.approx(young, rel=1e-8, abs=1e-9)
    assert advice.daly_s == pytest.approx(daly, rel=1e-8, abs=1e-9)
    assert young_interval_s(cost, mtbf) == advice.young_s
    assert daly_interval_s(cost, mtbf) == advice.daly_s
    assert advice.weights_every == weights_every
    assert advice.optimizer_every == weights_every  # no full cost given: a full save costs the same
    assert (advice.checkpoint_cost_s, advice.full_cost_s, advice.mtbf_s, advice.step_time_s) == (
        cost,
        cost,
        mtbf,
        step,
    )


@pytest.mark.parametrize(
    ("full_cost", "optimizer_every"),
    [
        (10.0, 310),  # the same cost: the same interval
        # sqrt(400000) + 40/3 + (40/9)*sqrt(0.004) - 40 = 606.07 s = 1.96 weights intervals -> 2
        (40.0, 620),
        # sqrt(900000) + 30 + 10*sqrt(0.009) - 90 = 889.63 s = 2.87 weights intervals -> 3
        (90.0, 930),
        (1.0, 310),  # cheaper than a weights save (measurement noise): never below the weights interval
    ],
)
def test_the_optimizer_interval_is_rounded_up_to_a_multiple_of_the_weights_interval(
    full_cost: float, optimizer_every: int
):
    advice = advise(10.0, 5000.0, 1.0, full_cost_s=full_cost)
    assert advice.weights_every == 310
    assert advice.optimizer_every == optimizer_every
    assert advice.optimizer_every % advice.weights_every == 0
    assert advice.full_cost_s == full_cost


@pytest.mark.parametrize(
    ("full_cost", "waste"),
    [
        # 310 steps of 1 s, 10 s per save: 10/320 + 320/(2*5000)
        (None, 10 / 320 + 320 / 10000),
        # every second save is full: mean stall 10 + 30/2 = 25 s; 25/335 + 335/10000
        (40.0, 25 / 335 + 335 / 10000),
    ],
)
def test_expected_waste_is_the_first_order_model_at_the_advised_steps(full_cost: float | None, waste: float):
    assert advise(10.0, 5000.0, 1.0, full_cost_s=full_cost).expected_waste == pytest.approx(waste, rel=1e-12)


def test_expected_waste_is_capped_at_everything():
    assert advise(300.0, 100.0, 1.0).expected_waste == 1.0


@pytest.mark.parametrize(
    ("devices", "rate", "mtbf"),
    [(3, 0.01, 120_000.0), (1, 1.0, 3600.0), (64, 0.5, 112.5), (8, 0.25, 1800.0), (5, 0.0, math.inf)],
)
def test_job_mtbf(devices: int, rate: float, mtbf: float):
    assert job_mtbf_s(devices, rate) == pytest.approx(mtbf)


def test_no_failures_on_record_means_checkpoint_rarely():
    advice = advise(0.01, math.inf, 0.05, full_cost_s=0.03)
    assert (advice.young_s, advice.daly_s) == (math.inf, math.inf)
    assert advice.weights_every == advice.optimizer_every == MAX_INTERVAL_STEPS
    # Every save is full (both intervals hit the cap): 0.03 s per 1e6 steps of 0.05 s, no rework.
    assert advice.expected_waste == pytest.approx(0.03 / (MAX_INTERVAL_STEPS * 0.05 + 0.03))
    assert "no failures on record" in advice.reasoning and "1,000,000 steps" in advice.reasoning
    data = advice.to_json()
    assert (data["mtbf_s"], data["young_s"], data["daly_s"]) == (None, None, None)
    assert data["weights_every"] == MAX_INTERVAL_STEPS
    free = advise(0.0, math.inf, 1.0)
    assert (free.young_s, free.weights_every) == (math.inf, MAX_INTERVAL_STEPS)
    assert advise_for_job(0.01, 4, 0.0, 0.05).mtbf_s == math.inf


def test_huge_intervals_are_capped_and_stay_multiples():
    # Daly: sqrt(9e10) + 1/3 - 1 = 299999.33 s -> 299999 steps of 1 s; the full save's optimum,
    # 31.6 weights intervals, is cut to the 3 that fit under the cap.
    advice = advise(1.0, 4.5e10, 1.0, full_cost_s=1000.0)
    assert advice.weights_every == 299_999
    assert advice.optimizer_every == 3 * 299_999
    assert advise(1.0, 1e12, 1e-3).weights_every == MAX_INTERVAL_STEPS


def test_the_reasoning_states_the_numbers():
    advice = advise_for_job(0.0041, 3, 0.01, 0.05, full_cost_s=0.012)
    text = advice.reasoning
    assert "a weights save stalls training 4.1 ms, a full save 12 ms" in text.lower()
    assert "with 3 devices at 0.01 failures per device-hour the job fails every 33.3 h" in text
    assert "Daly's interval is 31.4 s (Young's 31.4 s) = 627 steps of 50 ms" in text
    assert f"goes every {advice.optimizer_every:,} steps" in text
    assert "Expected waste" in text
    assert 2 <= len(re.findall(r"\.(?:\s|$)", text)) <= 4
    assert "at least twice the MTBF" in advise(300.0, 100.0, 1.0).reasoning
    assert "the job fails every 83.3 min" in advise(10.0, 5000.0, 1.0).reasoning


def test_to_json_round_trips_the_fields():
    advice = advise(10.0, 5000.0, 1.0, full_cost_s=40.0)
    data = advice.to_json()
    assert set(data) == {
        "checkpoint_cost_s",
        "full_cost_s",
        "mtbf_s",
        "step_time_s",
        "young_s",
        "daly_s",
        "weights_every",
        "optimizer_every",
        "expected_waste",
        "reasoning",
    }
    assert data["weights_every"] == 310 and data["optimizer_every"] == 620 and data["mtbf_s"] == 5000.0


@pytest.mark.parametrize(
    ("args", "kwargs", "argument"),
    [
        ((-1.0, 100.0, 1.0), {}, "checkpoint_cost_s"),
        ((math.nan, 100.0, 1.0), {}, "checkpoint_cost_s"),
        ((math.inf, 100.0, 1.0), {}, "checkpoint_cost_s"),
        (("1", 100.0, 1.0), {}, "checkpoint_cost_s"),
        ((True, 100.0, 1.0), {}, "checkpoint_cost_s"),
        ((1.0, 0.0, 1.0), {}, "mtbf_s"),
        ((1.0, -math.inf, 1.0), {}, "mtbf_s"),
        ((1.0, math.nan, 1.0), {}, "mtbf_s"),
        ((1.0, 100.0, 0.0), {}, "step_time_s"),
        ((1.0, 100.0, -0.5), {}, "step_time_s"),
        ((1.0, 100.0, math.inf), {}, "step_time_s"),
        ((1.0, 100.0, 1.0), {"full_cost_s": -1.0}, "full_cost_s"),
        ((1.0, 100.0, 1.0), {"full_cost_s": math.nan}, "full_cost_s"),
    ],
)
def test_advise_rejects_unusable_inputs_naming_the_argument(args: tuple, kwargs: dict, argument: str):
    with pytest.raises(ValueError, match=argument):
        advise(*args, **kwargs)


@pytest.mark.parametrize(
    ("devices", "rate", "argument"),
    [
        (0, 0.1, "devices"),
        (2.5, 0.1, "devices"),
        (True, 0.1, "devices"),
        (2, -1.0, "failures_per_device_hour"),
        (2, math.inf, "failures_per_device_hour"),
        (2, math.nan, "failures_per_device_hour"),
    ],
)
def test_job_mtbf_rejects_unusable_inputs_naming_the_argument(devices: int, rate: float, argument: str):
    with pytest.raises(ValueError, match=argument):
        job_mtbf_s(devices, rate)
