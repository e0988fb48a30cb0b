"""The throughput table: lookups (stored, scaled, by peak, default), online learning, JSON."""

from __future__ import annotations

import json

import pytest

from runtime.throughput import (
    DEFAULT_SAMPLES_PER_S_PER_TFLOP,
    LEARNING_WEIGHT,
    Rate,
    Source,
    ThroughputEntry,
    ThroughputMatrix,
    ThroughputTable,
    ThroughputTableError,
    choose_reference,
)

PEAKS = {"h100-sxm": 989.0, "a100-sxm": 312.0, "tpu-v4": 275.0}


def entry(job_class="resnet-small", flavor="a100-sxm", devices=1, rate=100.0, source=Source.BENCHMARK, samples=10):
    return ThroughputEntry(job_class, flavor, devices, rate, source, samples)


def test_the_old_imports_still_work():
    matrix = ThroughputMatrix(reference_flavor=choose_reference("a100-sxm", PEAKS), peak_tflops=PEAKS)
    assert isinstance(matrix.rate("x", "h100-sxm"), Rate)


def test_a_stored_entry_is_returned_as_it_is():
    table = ThroughputTable.of([entry()], PEAKS)
    assert table.lookup("resnet-small", "a100-sxm", 1) == entry()


def test_a_missing_count_between_two_is_interpolated_per_device():
    table = ThroughputTable.of([entry(devices=1, rate=100.0), entry(devices=4, rate=320.0)], PEAKS)
    got = table.lookup("resnet-small", "a100-sxm", 2)
    # per device: 100 at 1, 80 at 4 -> 100 - 20 * (1/3) at 2
    assert got.samples_per_s == pytest.approx(2 * (100 - 20 / 3))
    assert got.source == Source.ESTIMATED and "interpolated" in got.basis


def test_a_count_outside_one_measured_count_holds_its_per_device_rate():
    table = ThroughputTable.of([entry(devices=2, rate=180.0)], PEAKS)
    assert table.lookup("resnet-small", "a100-sxm", 8).samples_per_s == pytest.approx(720.0)
    assert table.lookup("resnet-small", "a100-sxm", 1).samples_per_s == pytest.approx(90.0)
    assert table.lookup("resnet-small", "a100-sxm", 8).estimated


def test_a_count_outside_several_follows_the_scaling_curve_they_teach():
    # A device's time per sample grows by the same amount with each device added: 1/96 s alone,
    # 1/90 at 2, 1/80 at 4 (the line through 2 and 4 passes through 1/96 at 1). So at 8: 1/65.45.
    table = ThroughputTable.of([entry(devices=2, rate=180.0), entry(devices=4, rate=320.0)], PEAKS)
    per_sample = [1 / 90, 1 / 80]
    slope = (per_sample[1] - per_sample[0]) / 2
    at_8 = table.lookup("resnet-small", "a100-sxm", 8)
    assert at_8.samples_per_s == pytest.approx(8 / (per_sample[0] + 6 * slope))
    assert at_8.estimated and "scaling curve learned from 2 device counts (2-4)" in at_8.basis
    assert table.lookup("resnet-small", "a100-sxm", 1).samples_per_s == pytest.approx(1 / (per_sample[0] - slope))
    # Three counts that do not lie on one line: the least-squares line, not any two of them.
    noisy = ThroughputTable.of(
        [entry(devices=1, rate=100.0), entry(devices=2, rate=190.0), entry(devices=4, rate=300.0)]
    )
    xs, ys = [0.0, 1.0, 3.0], [1 / 100, 2 / 190, 4 / 300]
    mx, my = sum(xs) / 3, sum(ys) / 3
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    assert noisy.lookup("resnet-small", "a100-sxm", 16).samples_per_s == pytest.approx(16 / (my - b * mx + 15 * b))


def test_a_curve_that_says_bigger_gangs_are_faster_per_device_is_not_believed():
    table = ThroughputTable.of([entry(devices=1, rate=100.0), entry(devices=2, rate=220.0)], PEAKS)
    assert table.lookup("resnet-small", "a100-sxm", 4).samples_per_s == pytest.approx(440.0)  # 2's rate held


def test_another_flavor_is_estimated_from_peak_figures():
    table = ThroughputTable.of([entry(rate=312.0)], PEAKS)
    got = table.lookup("resnet-small", "h100-sxm", 2)
    assert got.samples_per_s == pytest.approx(2 * 989.0)
    assert got.source == Source.ESTIMATED and "a100-sxm" in got.basis


def test_a_class_nobody_measured_gets_the_documented_default():
    table = ThroughputTable.of([entry()], PEAKS)
    got = table.lookup("llm-huge", "tpu-v4", 3)
    assert got.samples_per_s == pytest.approx(275.0 * DEFAULT_SAMPLES_PER_S_PER_TFLOP * 3)
    assert got.estimated and "never measured" in got.basis


def test_a_flavor_with_nothing_to_go_on_is_refused():
    with pytest.raises(LookupError, match="no peak bf16 figure"):
        ThroughputTable.of([entry()], PEAKS).lookup("resnet-small", "mystery-chip", 1)
    with pytest.raises(ValueError, match="devices"):
        ThroughputTable().lookup("resnet-small", "a100-sxm", 0)


def test_learning_replaces_a_benchmark_then_averages():
    table = ThroughputTable.of([entry(rate=100.0)], PEAKS)
    first = table.learn("resnet-small", "a100-sxm", 1, 200.0)
    assert first.lookup("resnet-small", "a100-sxm", 1) == entry(rate=200.0, source=Source.MEASURED, samples=1)
    second = first.learn("resnet-small", "a100-sxm", 1, 100.0)  # a plain mean while there are few
    assert second.lookup("resnet-small", "a100-sxm", 1).samples_per_s == pytest.approx(150.0)
    table = second
    for _ in range(20):
        table = table.learn("resnet-small", "a100-sxm", 1, 150.0)
    before = table.lookup("resnet-small", "a100-sxm", 1)
    after = table.learn("resnet-small", "a100-sxm", 1, 250.0).lookup("resnet-small", "a100-sxm", 1)
    assert after.samples_per_s == pytest.approx((1 - LEARNING_WEIGHT) * before.samples_per_s + LEARNING_WEIGHT * 250)
    assert after.samples == before.samples + 1
    # The old table is unchanged: tables are values.
    assert table.lookup("resnet-small", "a100-sxm", 1) == before


def test_learning_a_new_key_creates_a_measured_entry():
    table = ThroughputTable().learn("mlp", "tpu-v4", 4, 800.0)
    assert table.lookup("mlp", "tpu-v4", 4) == ThroughputEntry("mlp", "tpu-v4", 4, 800.0, Source.MEASURED, 1)
    with pytest.raises(ThroughputTableError, match="samples_per_s"):
        table.learn("mlp", "tpu-v4", 4, -1.0)


def test_measured_per_device_takes_the_smallest_count_and_feeds_the_matrix():
    table = ThroughputTable.of(
        [
            entry(flavor="a100-sxm", devices=1, rate=100.0),
            entry(flavor="a100-sxm", devices=4, rate=360.0),
            entry(flavor="h100-sxm", devices=2, rate=600.0, source=Source.MEASURED),
            entry(flavor="tpu-v4", devices=1, rate=50.0, source=Source.ESTIMATED),
        ],
        PEAKS,
    )
    measured = table.measured_per_device()
    assert measured == {("resnet-small", "a100-sxm"): 100.0, ("resnet-small", "h100-sxm"): 300.0}
    matrix = ThroughputMatrix(reference_flavor="a100-sxm", peak_tflops=PEAKS, measured=measured)
    assert matrix.rate("resnet-small", "h100-sxm") == Rate("resnet-small", "h100-sxm", 3000, estimated=False)
    assert matrix.rate("resnet-small", "tpu-v4").estimated


def test_json_round_trip():
    table = ThroughputTable.of([entry(), entry(devices=2, rate=190.0, source=Source.MEASURED, samples=3)], PEAKS)
    assert ThroughputTable.from_json(table.to_json()) == table


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda raw: raw.update(format="other"), "format"),
        (lambda raw: raw.update(entries={}), "entries"),
        (lambda raw: raw["entries"][0].update(devices=0), "entries[0].devices"),
        (lambda raw: raw["entries"][0].update(devices=True), "entries[0].devices"),
        (lambda raw: raw["entries"][0].update(samples_per_s="fast"), "entries[0].samples_per_s"),
        (lambda raw: raw["entries"][0].update(source="guessed"), "entries[0].source"),
        (lambda raw: raw["entries"][0].pop("flavor"), "entries[0].flavor"),
        (lambda raw: raw["entries"][0].update(colour="red"), "entries[0].colour"),
        (lambda raw: raw["entries"].append(dict(raw["entries"][0])), "entries[1]"),
        (lambda raw: raw["peak_tflops"].update({"tpu-v4": -3}), "peak_tflops.tpu-v4"),
    ],
)
def test_bad_json_names_the_field(mutate, field):
    raw = ThroughputTable.of([entry()], PEAKS).to_dict()
    mutate(raw)
    with pytest.raises(ThroughputTableError) as caught:
        ThroughputTable.from_json(json.dumps(raw))
    assert caught.value.field == field


def test_not_json_at_all():
    with pytest.raises(ThroughputTableError, match="not valid JSON"):
        ThroughputTable.from_json("{")
