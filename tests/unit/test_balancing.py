"""The balancer's pure decisions: splits, memory caps, efficiency, re-splitting with hysteresis, stragglers."""

from __future__ import annotations

import random

import pytest

from runtime.balancing import (
    Balancer,
    BalancerConfig,
    BalancingError,
    Split,
    balance_efficiency,
    max_micro_batch,
    proportional_split,
)


@pytest.mark.parametrize(
    ("batch", "weights", "caps", "chunks"),
    [
        (96, [1, 2, 4], None, ((14, 27, 55),)),  # 13.71, 27.43, 54.86: largest remainders win the rounding
        (96, [1, 1, 1], None, ((32, 32, 32),)),
        (10, [1, 1, 1], None, ((4, 3, 3),)),  # ties go to the lower rank
        (5, [1, 1, 100], None, ((1, 1, 3),)),  # every rank keeps at least one sample
        (96, [1, 2, 4], [40, 20, 40], ((36, 20, 40),)),  # rank 1 capped; its share goes to the others by weight
        (96, [1, 2, 4], [10, 20, 30], ((7, 14, 27), (7, 14, 27))),  # caps hold 60 < 96: two micro-steps
        (2, [1, 1, 1], None, ((1, 1, 0),)),  # fewer samples than ranks: no floor
    ],
)
def test_proportional_split(batch, weights, caps, chunks):
    split = proportional_split(batch, weights, caps)
    assert split.chunks == chunks
    assert sum(split.per_rank()) == batch


def test_slices_cover_the_global_batch_exactly_once():
    rng = random.Random(4)
    for _ in range(200):
        n = rng.randint(1, 6)
        batch = rng.randint(1, 300)
        weights = [rng.uniform(0.01, 5) for _ in range(n)]
        caps = [rng.choice([None, rng.randint(1, 80)]) for _ in range(n)]
        split = proportional_split(batch, weights, caps)
        seen = sorted(i for rank in range(n) for lo, hi in split.slices(rank) for i in range(lo, hi))
        assert seen == list(range(batch))
        for chunk in split.chunks:
            assert all(b <= (c if c is not None else batch) for b, c in zip(chunk, caps, strict=True))
        assert split == proportional_split(batch, weights, caps)  # every rank computes the same split


def test_split_errors_name_the_field():
    with pytest.raises(BalancingError, match="caps: a rank that cannot hold one sample"):
        proportional_split(10, [1, 1], [0, 5])
    with pytest.raises(BalancingError, match="weights"):
        proportional_split(10, [0, 0])
    with pytest.raises(BalancingError, match="split: covers 9 samples"):
        Split(10, ((4, 5),))
    assert Split.from_json(10, [[4, 6]]).per_rank() == (4, 6)
    with pytest.raises(BalancingError, match="split: expected a list"):
        Split.from_json(10, [["4"]])


def test_max_micro_batch_follows_the_memory_model():
    # 1 GiB at 70%: 751,619,276 bytes; 10M params * 16 = 160M for state; 1 MB a sample: 591 samples.
    assert max_micro_batch(2**30, param_count=10_000_000, activation_bytes_per_sample=1e6) == 591
    with pytest.raises(BalancingError, match="memory: the model's state alone"):
        max_micro_batch(2**30, param_count=100_000_000, activation_bytes_per_sample=1e6)


def test_an_equal_split_on_speeds_1_2_4_gets_three_sevenths():
    assert balance_efficiency((32, 32, 32), (1, 2, 4)) == pytest.approx(3 / 7)
    assert balance_efficiency((16, 32, 64), (1, 2, 4)) == pytest.approx(1.0)


def speeds_after(step: int, before: list[float], after: list[float], at: int) -> list[float]:
    return after if step >= at else before


@pytest.mark.parametrize("mode", ["equal", "static"])
def test_equal_and_static_never_re_split(mode):
    balancer = Balancer(BalancerConfig(mode=mode), 96, [1, 2, 4])
    first = balancer.split
    assert first.per_rank() == ((32, 32, 32) if mode == "equal" else (14, 27, 55))
    for step in range(1, 40):
        decision = balancer.observe(step, speeds_after(step, [100, 200, 400], [100, 100, 400], 5))
        assert not decision.changed and decision.split == first


@pytest.mark.parametrize("blend", ["fixed", "trust"])
def test_dynamic_adapts_after_drift_and_then_holds(blend):
    config = BalancerConfig(blend=blend, patience=3)
    balancer = Balancer(config, 96, [1, 2, 4])
    changes = []
    for step in range(1, 60):
        decision = balancer.observe(step, speeds_after(step, [100, 200, 400], [100, 100, 400], 10))
        if decision.changed:
            changes.append(step)
    # A 2x change of level: taken once it has lasted shift_patience checks (a gradual drift waits for
    # `patience`), not before.
    assert changes and changes[0] == 10 + config.shift_patience - 1
    assert changes[-1] < 45  # settles
    share = balancer.split.per_rank()
    assert share[1] < 27  # rank 1 slowed: it got less
    efficiency = balance_efficiency(share, [100, 100, 400])
    assert efficiency > (0.9 if blend == "trust" else 0.6)


def test_noise_around_balance_does_not_make_it_flap():
    rng = random.Random(1)
    balancer = Balancer(BalancerConfig(blend="trust"), 96, [1, 2, 4])
    changes = 0
    for step in range(1, 200):
        noisy = [s * rng.uniform(0.97, 1.03) for s in (100, 200, 400)]
        changes += balancer.observe(step, noisy).changed
    assert changes == 0


def test_a_rank_much_slower_than_its_score_is_reported_as_a_straggler():
    config = BalancerConfig(straggler_ratio=0.5, straggler_patience=5)
    balancer = Balancer(config, 96, [1, 1, 1])
    reported = []
    for step in range(1, 12):
        reported.append(balancer.observe(step, [100, 100, 20]).stragglers)
    assert reported[3] == () and reported[4] == (2,) and reported[-1] == (2,)
    # A uniformly slow gang has no straggler: the promise scales with what the gang measures.
    even = Balancer(config, 96, [1, 1, 1])
    assert all(even.observe(step, [20, 20, 20]).stragglers == () for step in range(1, 12))


def test_config_errors_name_the_field():
    with pytest.raises(BalancingError, match=r"balancing\.mode: 'fast' is not one of dynamic, static, equal"):
        BalancerConfig(mode="fast")
    with pytest.raises(BalancingError, match=r"balancing\.thresh"):
        BalancerConfig.from_json({"thresh": 0.1})
    assert BalancerConfig.from_json({"mode": "static"}).mode == "static"
    assert BalancerConfig.from_json(None) == BalancerConfig()
    with pytest.raises(BalancingError, match="samples_per_s: has 2 entries"):
        Balancer(BalancerConfig(), 96, [1, 1, 1]).observe(1, [1, 1])


def test_a_small_gain_that_lasts_is_taken_and_a_passing_one_is_not():
    # Rank 1 drifts to 96% of its speed: the proportional split is then 2.7% short, under the 5%
    # threshold, but the loss lasts, so after small_patience checks the split follows.
    config = BalancerConfig(blend="fixed", score_weight=0.0, patience=3, small_threshold=0.015, small_patience=10)
    balancer = Balancer(config, 960, [100, 200, 400])
    for step in range(1, 6):
        assert not balancer.observe(step, [100, 200, 400]).changed
    changes = [step for step in range(6, 40) if balancer.observe(step, [100, 192, 400]).changed]
    assert len(changes) == 1 and changes[0] >= 6 + config.small_patience - 1
    assert balance_efficiency(balancer.split.per_rank(), [100, 192, 400]) > 0.99
    # The same loss for fewer checks than small_patience changes nothing.
    balancer = Balancer(config, 960, [100, 200, 400])
    for step in range(1, 6):
        balancer.observe(step, [100, 200, 400])
    for step in range(6, 6 + config.small_patience - 2):
        assert not balancer.observe(step, [100, 192, 400]).changed
    assert not balancer.observe(40, [100, 200, 400]).changed


def test_small_threshold_is_checked():
    with pytest.raises(BalancingError, match="small_threshold"):
        BalancerConfig(threshold=0.05, small_threshold=0.06)


def test_a_change_of_level_is_followed_at_once_and_one_outlier_is_not():
    """A rank that halves its speed: after shift_patience checks its estimate is the new speed (not an
    EWMA still half way) and the split follows at once. A single outlier moves nothing."""
    balancer = Balancer(BalancerConfig(blend="trust"), 170, [1, 3, 5, 8])
    for step in range(1, 30):
        assert not balancer.observe(step, [10, 30, 50, 80]).changed
    assert not balancer.observe(30, [10, 30, 50, 20]).changed  # one step 4x slow: held back
    assert balancer.predicted[3] == pytest.approx(80)
    assert not balancer.observe(31, [10, 30, 50, 80]).changed
    assert not balancer.observe(32, [10, 30, 50, 40]).changed
    assert not balancer.observe(33, [10, 30, 50, 40]).changed
    decision = balancer.observe(34, [10, 30, 50, 40])
    assert decision.changed and "changed speed" in decision.reason
    assert balancer.predicted[3] == pytest.approx(40)
    assert balancer.split == proportional_split(170, balancer.weights())
    # Short of 1.0 only by what the scores (1:3:5:8) still weigh in the trust blend after 34 checks.
    assert balance_efficiency(balancer.split.per_rank(), [10, 30, 50, 40]) > 0.96
    # A rank that speeds up 2x is followed the same way.
    for step in range(35, 38):
        decision = balancer.observe(step, [10, 60, 50, 40])
    assert decision.changed and balancer.predicted[1] == pytest.approx(60)
    assert balance_efficiency(balancer.split.per_rank(), [10, 60, 50, 40]) > 0.95


def test_alternating_outliers_are_not_a_change_of_level():
    balancer = Balancer(BalancerConfig(blend="trust"), 96, [1, 2, 4])
    for step in range(1, 40):
        factor = 1.5 if step % 2 else 0.6
        decision = balancer.observe(step, [100, 200, 400 * factor if step > 10 else 400])
        assert "changed speed" not in decision.reason


def test_a_rank_whose_speed_is_noisy_needs_a_larger_change_to_count_as_one():
    """A rank whose own compute competes for a busy host measures 30-40% off its estimate now and
    then; three such steps in a row the same way are not a change of level for it (its bar is 3x its
    usual deviation), while a rank that measured steadily would have been re-split for."""
    rng = random.Random(3)
    balancer = Balancer(BalancerConfig(blend="trust"), 64, [1, 1])
    for step in range(1, 80):
        noisy = 300 * rng.choice([0.65, 0.8, 1.0, 1.0, 1.2, 1.35])
        balancer.observe(step, [300, noisy])
    changed = [balancer.observe(step, [300, 300 * 0.7]).changed for step in range(80, 83)]
    assert changed == [False, False, False]
    steady = Balancer(BalancerConfig(blend="trust"), 64, [1, 1])
    for step in range(1, 80):
        steady.observe(step, [300, 300])
    assert [steady.observe(step, [300, 300 * 0.7]).changed for step in range(80, 83)] == [False, False, True]
