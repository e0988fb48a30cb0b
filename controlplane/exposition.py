"""The Prometheus text format (0.0.4), written fast enough for 70,000 series in a scrape.

``prometheus_client.generate_latest`` writes each sample through several general functions (name
validation, UTF-8 escaping schemes, OpenMetrics suffixes): at 8,000 devices that alone takes most of a
second, over the 500 ms a scrape may take. ``render`` writes the same bytes for the families Polychip
makes (gauges, counters and histograms, without timestamps or ``_created`` samples), with two savings:
samples that share one labels dict have their label text made once, and the per-device families are
``LineGauge``s, whose lines are made as the devices are read (tests/unit/test_exposition.py checks the
output against ``generate_latest``'s, byte for byte).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

_TYPES = {"gauge": "gauge", "counter": "counter", "histogram": "histogram", "unknown": "untyped"}


def _escape(value: str) -> str:
    if "\\" not in value and "\n" not in value and '"' not in value:
        return value  # nearly always: the replaces cost more than the test
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def label_text(labels: Mapping[str, str]) -> str:
    """``{a="x",b="y"}``: names sorted, values escaped, as generate_latest writes them."""
    if not labels:
        return ""
    return "{" + ",".join([f'{k}="{_escape(labels[k])}"' for k in sorted(labels)]) + "}"


class LineGauge(Metric):
    """A gauge of many series (one per device) kept as text lines: ``render`` writes them as they are.

    A sample of prometheus_client costs a named tuple and a dict per series; at 8,000 devices times 8
    families that is most of a scrape. Here the caller makes a device's label text once and each family
    adds one line. ``samples`` is still there, made on demand, for whoever reads the family otherwise
    (``generate_latest``, tests)."""

    def __init__(self, name: str, documentation: str) -> None:
        super().__init__(name, documentation, "gauge")
        self.rows: list[tuple[str, Mapping[str, str], float]] = []

    def add(self, text: str, labels: Mapping[str, str], value: float) -> None:
        """``text``: ``label_text(labels)``, made once by the caller for all its families."""
        self.rows.append((text, labels, value))

    @property
    def samples(self) -> list[Sample]:
        return [Sample(self.name, dict(labels), value, None, None) for _, labels, value in self.rows]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        if value:  # Metric.__init__ sets [] here; nothing else may
            raise AttributeError("LineGauge takes series through add()")

    def lines(self) -> Iterator[str]:
        name = self.name
        for text, _, value in self.rows:
            yield f"{name}{text} {floatToGoString(value)}\n"


def render(metrics: Iterable[Metric]) -> bytes:
    out: list[str] = []
    # id(labels) -> (labels, text): the dict is held, so that its id cannot be reused by another.
    texts: dict[int, tuple[Mapping[str, str], str]] = {}
    for metric in metrics:
        mtype = _TYPES.get(metric.type)
        if mtype is None:
            raise ValueError(f"{metric.name}: type {metric.type} is not written here; use generate_latest")
        name = f"{metric.name}_total" if mtype == "counter" else metric.name
        doc = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        out.append(f"# HELP {name} {doc}\n# TYPE {name} {mtype}\n")
        if isinstance(metric, LineGauge):
            out.extend(metric.lines())
            continue
        for sample in metric.samples:
            if sample.timestamp is not None or sample.name.endswith("_created"):
                raise ValueError(f"{sample.name}: timestamps and _created samples are not written here")
            labels = sample.labels
            text = ""
            if labels:
                held = texts.get(id(labels))
                if held is not None and held[0] is labels:
                    text = held[1]
                else:
                    text = label_text(labels)
                    texts[id(labels)] = (labels, text)
            out.append(f"{sample.name}{text} {floatToGoString(sample.value)}\n")
    return "".join(out).encode()
