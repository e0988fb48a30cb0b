import math

import pytest

from runtime.scheduling import Limit, UsageInterval, decayed_usage, dominant_share

HOUR = 3600.0


def test_constant_usage_for_a_long_time_reads_as_that_amount():
    assert decayed_usage([(0.0, None, 8.0)], now=1000 * HOUR, half_life_s=HOUR) == pytest.approx(8.0)


def test_usage_counts_half_after_one_half_life():
    intervals = [UsageInterval(0.0, 10 * HOUR, 4.0), UsageInterval(2 * HOUR, 5 * HOUR, 2.0)]
    at_end = decayed_usage(intervals, now=10 * HOUR, half_life_s=HOUR)
    assert decayed_usage(intervals, now=11 * HOUR, half_life_s=HOUR) == pytest.approx(at_end / 2)
    assert decayed_usage(intervals, now=13 * HOUR, half_life_s=HOUR) == pytest.approx(at_end / 8)


def test_closed_form_matches_a_numeric_integral():
    start, end, now, half_life = 100.0, 700.0, 1000.0, 400.0
    rate = math.log(2) / half_life
    steps = 60_000
    width = (end - start) / steps
    numeric = rate * sum(3.0 * math.exp(-rate * (now - (start + (i + 0.5) * width))) * width for i in range(steps))
    assert decayed_usage([(start, end, 3.0)], now=now, half_life_s=half_life) == pytest.approx(numeric, rel=1e-9)


@pytest.mark.parametrize(
    ("intervals", "expected"),
    [
        ([], 0.0),
        ([(50.0, 50.0, 5.0)], 0.0),  # empty interval
        ([(200.0, 300.0, 5.0)], 0.0),  # entirely after now
        ([(0.0, 10.0, 0.0)], 0.0),  # nothing in use
    ],
)
def test_nothing_to_count(intervals, expected):
    assert decayed_usage(intervals, now=100.0, half_life_s=60.0) == expected


def test_the_part_of_an_interval_after_now_is_ignored():
    assert decayed_usage([(0.0, 500.0, 2.0)], now=100.0, half_life_s=60.0) == decayed_usage(
        [(0.0, None, 2.0)], now=100.0, half_life_s=60.0
    )


def test_half_life_must_be_positive():
    with pytest.raises(ValueError, match="half_life_s must be positive"):
        decayed_usage([], now=0.0, half_life_s=0.0)


LIMITS = {"h100": Limit(4), "a100": Limit(10), "nau": Limit(20_000), "tpu": Limit(0)}


@pytest.mark.parametrize(
    ("usage", "history", "weight", "blend", "expected"),
    [
        ({}, {}, 1.0, 0.5, 0.0),
        # The dominant resource: 2/4 of h100 beats 3/10 of a100.
        ({"h100": 2, "a100": 3}, {}, 1.0, 0.0, 0.5),
        # History blends in: half of (now 2 + history 4) / 4.
        ({"h100": 2}, {"h100": 4.0}, 1.0, 0.5, 0.75),
        ({"h100": 2}, {"h100": 4.0}, 1.0, 1.0, 1.0),
        # NAU is a resource like the others.
        ({"nau": 15_000}, {}, 1.0, 0.0, 0.75),
        # A resource with nominal 0 counts as if its nominal were one unit: 3 borrowed tpu weigh 3.
        ({"nau": 15_000, "tpu": 3}, {}, 1.0, 0.0, 3.0),
        # Weight divides.
        ({"h100": 2}, {}, 2.0, 0.0, 0.25),
    ],
)
def test_dominant_share(usage, history, weight, blend, expected):
    assert dominant_share(LIMITS, usage, history, weight, blend) == pytest.approx(expected)


def test_history_breaks_a_tie_in_current_usage():
    busy_before = dominant_share(LIMITS, {"h100": 1}, {"h100": 3.0}, 1.0)
    idle_before = dominant_share(LIMITS, {"h100": 1}, {}, 1.0)
    assert idle_before < busy_before


def test_a_zero_weight_tenant_is_last_unless_idle():
    assert dominant_share(LIMITS, {"h100": 1}, {}, 0.0) == math.inf
    assert dominant_share(LIMITS, {}, {}, 0.0) == 0.0
