"""controlplane.exposition writes what prometheus_client's generate_latest writes, byte for byte."""

from __future__ import annotations

import math

import pytest
from prometheus_client import generate_latest
from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from controlplane.exposition import LineGauge, label_text, render


def families() -> list[Metric]:
    gauge = GaugeMetricFamily("polychip_g", "a gauge\nover two lines \\ with a backslash", labels=["b", "a"])
    gauge.add_metric(["x", "y"], 1.5)
    gauge.add_metric(['quote " here', "back\\slash\nnewline"], -2)
    gauge.add_metric(["inf", "nan"], math.inf)
    gauge.add_metric(["big", "small"], 12345678.0)
    gauge.add_metric(["tiny", "neg"], 1e-9)
    bare = GaugeMetricFamily("polychip_bare", "no labels")
    bare.add_metric([], float("nan"))
    counter = CounterMetricFamily("polychip_c", "a counter", labels=["task"])
    counter.add_metric(["t1"], 3)
    histogram = HistogramMetricFamily("polychip_h", "a histogram", labels=["tenant"])
    histogram.add_metric(["acme"], [("1.0", 1), ("5.0", 3), ("+Inf", 4)], 9.5)
    lines = LineGauge("DCGM_FI_DEV_GPU_TEMP", "per device")
    for device, temp in (("n/0", 61.0), ('n/"1"', 70.25)):
        labels = {"device": device, "vendor": "nvidia", "flavor": "h100"}
        lines.add(label_text(labels), labels, temp)
    shared = {"device": "n/2", "flavor": "h100"}
    first, second = GaugeMetricFamily("polychip_s1", "shares"), GaugeMetricFamily("polychip_s2", "shares")
    for family in (first, second):
        family.samples.append(type(gauge.samples[0])(family.name, shared, 1.0, None, None))
    empty = GaugeMetricFamily("polychip_empty", "no series yet", labels=["tenant"])
    return [gauge, bare, counter, histogram, lines, first, second, empty]


class Fixed(Collector):
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self):  # type: ignore[no-untyped-def]
        return iter(self.metrics)


def test_render_writes_generate_latests_bytes():
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Fixed(families()))
    assert render(families()) == generate_latest(registry)


def test_a_line_gauge_reads_as_samples_too():
    lines = LineGauge("polychip_x", "x")
    lines.add('{a="1"}', {"a": "1"}, 2.0)
    assert [(s.name, s.labels, s.value) for s in lines.samples] == [("polychip_x", {"a": "1"}, 2.0)]
    with pytest.raises(AttributeError):
        lines.samples = [lines.samples[0]]


def test_a_type_it_does_not_write_is_refused():
    info = InfoMetricFamily("polychip_i", "info", value={"a": "b"})
    with pytest.raises(ValueError, match="generate_latest"):
        render([info])
