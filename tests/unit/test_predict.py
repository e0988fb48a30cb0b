"""Failure prediction: window labels, the scaler, determinism, the live source, and that the LSTM beats chance."""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Iterator

import pytest
import torch

from runtime.recovery.health import (
    FEATURES,
    DeviceBaseline,
    DeviceHistory,
    DeviceTelemetrySource,
    generate_histories,
)
from runtime.recovery.predict import (
    FeatureScaler,
    LSTMPredictor,
    ThresholdBaseline,
    alert_lead_time,
    best_f1_threshold,
    encode,
    evaluate,
    split_for_validation,
    visible_share,
    windows,
)


@pytest.fixture(autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The model is small: on a shared CI machine one thread trains it faster than contended OpenMP threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _history_with_rows(rows: int, fail_at: int | None) -> DeviceHistory:
    """Each sample carries its own minute in every feature, so a window says where it ends."""
    return DeviceHistory(samples=[(float(m),) * len(FEATURES) for m in range(rows)], fail_at=fail_at, mode="thermal")


@pytest.mark.parametrize(
    ("end", "label"),
    [(29, 0.0), (50, 0.0), (69, 0.0), (70, 1.0), (85, 1.0), (99, 1.0), (100, None), (120, None)],
)
def test_a_failure_at_minute_100_labels_windows_ending_70_to_99_positive(end: int, label: float | None) -> None:
    x, y = windows([_history_with_rows(100, fail_at=100)], window=30, horizon=30)
    labels_by_end = {int(x[i, -1, 0]): float(y[i]) for i in range(len(y))}
    assert sorted(labels_by_end) == list(range(29, 100))  # every end from the first full window to the last sample
    assert labels_by_end.get(end) == label


def test_windows_hold_the_samples_in_order_and_a_healthy_history_is_all_negative() -> None:
    x, y = windows([_history_with_rows(40, fail_at=None)], window=30, horizon=30)
    assert x.shape == (11, 30, len(FEATURES))
    assert torch.equal(x[3, :, 2], torch.arange(3, 33, dtype=torch.float32))
    assert float(y.sum()) == 0.0
    x, _ = windows([_history_with_rows(40, fail_at=None)], window=30, horizon=30, stride=5)
    assert [int(w[-1, 0]) for w in x] == [29, 34, 39]


def test_generated_histories_stop_at_the_failure_and_follow_the_requested_shares() -> None:
    histories = generate_histories(400, seed=11, minutes=240, failure_share=0.4)
    failing = [h for h in histories if h.fail_at is not None]
    assert 0.3 < len(failing) / len(histories) < 0.5
    assert all(len(h.samples) == h.fail_at for h in failing)
    assert all(len(h.samples) == 240 and h.mode == "healthy" for h in histories if h.fail_at is None)
    sudden = [h for h in failing if h.mode == "sudden"]
    assert 0.05 < len(sudden) / len(failing) < 0.25
    assert all(h.precursor_from is None for h in sudden)
    leads = [h.fail_at - h.precursor_from for h in failing if h.fail_at is not None and h.precursor_from is not None]
    assert len(leads) == len(failing) - len(sudden)
    assert all(19 <= lead <= 90 for lead in leads)  # the precursor shows 20-90 minutes ahead (first whole minute)
    assert all(len(sample) == len(FEATURES) for h in histories for sample in h.samples)


def test_histories_are_deterministic_in_the_seed() -> None:
    assert generate_histories(20, seed=3) == generate_histories(20, seed=3)
    assert generate_histories(20, seed=3) != generate_histories(20, seed=4)


def test_the_scaler_is_fit_on_the_training_part_only_and_evaluation_does_not_refit() -> None:
    train = generate_histories(40, seed=21)
    predictor = LSTMPredictor(hidden=8).fit(train, seed=5, epochs=1)
    fit_part, validation_part = split_for_validation(train, seed=5)
    assert fit_part and validation_part and len(fit_part) + len(validation_part) == len(train)
    expected = FeatureScaler.fit(encode(windows(fit_part)[0]))
    everything = FeatureScaler.fit(encode(windows(train)[0]))
    assert predictor.scaler is not None
    assert torch.allclose(predictor.scaler.mean, expected.mean) and torch.allclose(predictor.scaler.std, expected.std)
    assert not torch.allclose(predictor.scaler.mean, everything.mean)  # the validation devices were left out

    # Held-out devices that run 40 degrees hotter change the scores, never the scaler.
    mean_before = predictor.scaler.mean.clone()
    hot = [
        DeviceHistory([(s[0] + 40.0, *s[1:]) for s in h.samples], h.fail_at, h.mode)
        for h in generate_histories(10, seed=22)
    ]
    evaluate(predictor, hot)
    assert torch.equal(predictor.scaler.mean, mean_before)


def test_scaler_standardises_what_it_was_fit_on() -> None:
    encoded = encode(windows(generate_histories(10, seed=8))[0])
    scaled = FeatureScaler.fit(encoded).transform(encoded).reshape(-1, encoded.shape[-1])
    assert torch.allclose(scaled.mean(dim=0), torch.zeros(encoded.shape[-1]), atol=1e-3)
    assert torch.allclose(scaled.std(dim=0), torch.ones(encoded.shape[-1]), atol=1e-3)


def test_training_is_deterministic_given_the_seed_and_survives_a_save() -> None:
    train = generate_histories(40, seed=31)
    torch.manual_seed(123)
    expected_draw = torch.rand(1)
    torch.manual_seed(123)
    first = LSTMPredictor(hidden=16).fit(train, seed=9, epochs=2)
    assert torch.equal(torch.rand(1), expected_draw)  # the caller's global RNG is left alone
    second = LSTMPredictor(hidden=16).fit(train, seed=9, epochs=2)
    other = LSTMPredictor(hidden=16).fit(train, seed=10, epochs=2)
    weights = first.state()["weights"]
    assert all(torch.equal(weights[name], second.state()["weights"][name]) for name in weights)
    assert first.threshold == second.threshold
    assert not all(torch.equal(weights[name], other.state()["weights"][name]) for name in weights)

    buffer = io.BytesIO()
    torch.save(first.state(), buffer)
    buffer.seek(0)
    loaded = LSTMPredictor.from_state(torch.load(buffer, weights_only=True))
    x, _ = windows(generate_histories(5, seed=32))
    assert torch.equal(loaded.scores(x), first.scores(x))
    window = [tuple(float(v) for v in row) for row in x[0]]
    assert loaded.score(window) == pytest.approx(float(first.scores(x[:1])[0]))
    assert loaded.predict(window) == (loaded.score(window) >= loaded.threshold)


def test_best_f1_threshold_cuts_between_distinct_scores() -> None:
    scores = torch.tensor([0.9, 0.8, 0.8, 0.3, 0.1])
    labels = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0])
    threshold, f1 = best_f1_threshold(scores, labels)
    # Alerting at >= 0.3 catches all three positives with one false alarm: F1 = 6/7, the best cut.
    assert threshold == pytest.approx(0.3) and f1 == pytest.approx(6 / 7)


def test_the_live_source_compresses_time_and_fails_on_schedule() -> None:
    source = DeviceTelemetrySource(seed=1, minutes_per_second=60.0, origin_s=100.0)
    first = source.sample(100.0)
    assert set(first) == set(FEATURES)
    assert source.sample(100.01) == first  # 0.6 emulated minutes later: still minute 0
    assert source.sample(100.5) != first  # half a second is 30 emulated minutes: a new reading
    assert len(source.window(101.0, 30)) == 30  # one real second is 60 emulated minutes

    source.start_degradation("thermal", minutes_to_failure=30.0, now_s=101.0)
    assert not source.failed(101.0)
    assert not source.failed(101.49)  # 29.4 emulated minutes later
    assert source.failed(101.5)  # 30 minutes: the failure
    assert source.failed(200.0)


def test_a_thermal_degradation_heats_the_device_against_its_healthy_twin() -> None:
    healthy = DeviceTelemetrySource(seed=4, minutes_per_second=1.0, origin_s=0.0)
    degrading = DeviceTelemetrySource(seed=4, minutes_per_second=1.0, origin_s=0.0)
    degrading.start_degradation("thermal", minutes_to_failure=30.0, now_s=60.0)
    healthy.window(60.0, 1)
    assert healthy.window(60.0, 61) == degrading.window(60.0, 61)  # identical up to the onset
    hotter = degrading.sample(89.0)["temperature_c"] - healthy.sample(89.0)["temperature_c"]
    assert hotter > 20.0


def test_a_sudden_failure_has_no_precursor() -> None:
    """Its readings are the healthy device's own, draw for draw, right up to the failure."""
    for seed in range(5):
        healthy = DeviceTelemetrySource(seed=seed, minutes_per_second=1.0, origin_s=0.0)
        sudden = DeviceTelemetrySource(seed=seed, minutes_per_second=1.0, origin_s=0.0)
        sudden.start_degradation("sudden", minutes_to_failure=45.0, now_s=30.0)
        assert not sudden.failed(74.0) and sudden.failed(75.0)
        assert sudden.window(74.0, 75) == healthy.window(74.0, 75)


def test_sudden_failures_in_generated_histories_look_like_healthy_devices() -> None:
    """Across the generator: the last half hour of a sudden failure moves as much as a healthy half hour."""
    histories = generate_histories(600, seed=41)

    def drift(h: DeviceHistory) -> float:  # how much the temperature changed over the last 30 minutes
        return h.samples[-1][0] - h.samples[-30][0]

    sudden = [drift(h) for h in histories if h.mode == "sudden"]
    thermal = [drift(h) for h in histories if h.mode == "thermal"]
    healthy = [drift(h) for h in histories if h.mode == "healthy"]
    assert len(sudden) >= 20 and len(thermal) >= 20
    spread = statistics.pstdev(healthy)
    assert abs(statistics.mean(sudden) - statistics.mean(healthy)) < spread / 2
    assert statistics.mean(thermal) - statistics.mean(healthy) > spread / 2  # the check can tell a precursor


def test_the_lstm_beats_chance_on_held_out_devices_and_so_does_the_baseline() -> None:
    """Beating chance: precision and recall both above the positive rate. No headline figure is asserted."""
    train = generate_histories(100, seed=100)
    test = generate_histories(80, seed=101)  # other devices, another seed
    predictor = LSTMPredictor().fit(train, seed=0, epochs=4)
    result = evaluate(predictor, test)
    assert result.windows == result.positives + result.negatives and result.positives > 0
    assert result.horizon_min == 30
    assert result.precision > result.positive_rate and result.recall > result.positive_rate
    assert result.recall <= visible_share(test) + 0.05  # sudden failures are not announced

    fitted_baseline = ThresholdBaseline().fit(train)
    baseline = evaluate(fitted_baseline, test)
    assert baseline.precision > baseline.positive_rate and baseline.recall > baseline.positive_rate
    assert evaluate(ThresholdBaseline.from_state(fitted_baseline.state()), test) == baseline

    failing = next(h for h in test if h.fail_at is not None and h.mode != "sudden")
    lead = alert_lead_time(predictor, failing)
    assert lead is None or 1 <= lead <= 30


def test_the_source_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        DeviceTelemetrySource(seed=0, minutes_per_second=0.0)
    source = DeviceTelemetrySource(seed=0)
    with pytest.raises(ValueError):
        source.start_degradation("meteor", 10.0, 0.0)
    baseline = DeviceBaseline(40.0, 30.0, 80.0, 400.0, 0.01, 0.01, 0.02, 0.0, 0.0, 0.0, 0.0)
    quiet = DeviceTelemetrySource(seed=0, baseline=baseline, origin_s=0.0)
    readings = [quiet.sample(float(t)) for t in range(200)]
    assert all(math.isfinite(r[f]) for r in readings for f in FEATURES)
    # No transients, no job changes, no diurnal swing: the device sits near its operating point.
    temperatures = [r["temperature_c"] for r in readings[20:]]
    assert min(temperatures) > 40.0 + 30.0 * 0.55 - 5.0 and max(temperatures) < 40.0 + 30.0 + 5.0
    assert max(temperatures) - min(temperatures) < 10.0


def test_a_longer_alert_streak_never_alerts_more_and_never_warns_of_more_failures():
    from runtime.recovery.predict import alert_policy_view

    torch.set_num_threads(1)
    histories = generate_histories(40, seed=5)
    model = LSTMPredictor().fit(generate_histories(60, seed=4), seed=0, epochs=2)
    one, three = (alert_policy_view(model, histories, streak=k) for k in (1, 3))
    assert three.false_alerts_per_device_hour <= one.false_alerts_per_device_hour
    assert three.failures_warned <= one.failures_warned
    assert one.failing_devices == three.failing_devices == sum(h.fail_at is not None for h in histories)
