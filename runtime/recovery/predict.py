"""Device-failure prediction: a small LSTM beside a threshold baseline, judged on held-out histories.

The reference article claims an LSTM predicts hardware failures 30 minutes ahead with 89% accuracy.
This module builds that kind of predictor and measures it honestly, next to the simple baseline any
operator would try first. The histories are **synthetic** (``runtime.recovery.health``): no real
failure data exists here, so the figures say how well each method reads that generator's precursors,
not how it would fare on a real fleet. Accuracy is reported but is the wrong headline: with a few
percent of positive windows, "never alert" is already over 90% accurate. Precision and recall are
what count.

The task, per window: given the last ``WINDOW_MIN`` minutes of a device's telemetry, will it fail
within the next ``HORIZON_MIN`` minutes? A window ending at minute ``end`` (its last sample) is
positive when ``0 < fail_at - end <= horizon``. Precursors start 20 to 90 minutes before a failure,
so 30 minutes of context usually sees one start, and a window of 30 keeps training cheap; some
positive windows (the early minutes of a short precursor, every window of a sudden failure) carry no
signal at all, and the figures include them.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import torch
from torch import nn

from runtime.recovery.health import FEATURES, DeviceHistory, generate_histories

HORIZON_MIN = 30  # the article's "30 minutes ahead"
WINDOW_MIN = 30  # minutes of telemetry each prediction sees
REFERENCE_MIN = 10  # the window's first minutes, taken as the device's recent normal
STATE_VERSION = 1

# Error counts and jitter are heavy-tailed; their logarithms are closer to normal and easier to learn.
_LOG_FEATURES = frozenset({"ecc_errors", "pcie_errors", "step_jitter"})


def windows(
    histories: Sequence[DeviceHistory], window: int = WINDOW_MIN, horizon: int = HORIZON_MIN, *, stride: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """All windows of ``window`` minutes in the histories, with their labels.

    Returns ``X`` of shape [N, window, len(FEATURES)] (raw readings) and ``y`` of shape [N] (1.0 when
    the device fails within ``horizon`` minutes after the window's last sample). Windows ending after
    the failure do not exist: the history stops there.
    """
    if window < 1 or horizon < 1 or stride < 1:
        raise ValueError("window, horizon and stride must be >= 1")
    blocks: list[torch.Tensor] = []
    labels: list[torch.Tensor] = []
    for history in histories:
        if len(history.samples) < window:
            continue
        series = torch.tensor(history.samples, dtype=torch.float32)
        ends = torch.arange(window - 1, len(history.samples), stride)
        blocks.append(series.unfold(0, window, 1)[ends - window + 1].transpose(1, 2))
        if history.fail_at is None:
            labels.append(torch.zeros(len(ends)))
        else:
            lead = history.fail_at - ends
            labels.append(((lead > 0) & (lead <= horizon)).float())
    if not blocks:
        return torch.zeros(0, window, len(FEATURES)), torch.zeros(0)
    return torch.cat(blocks), torch.cat(labels)


def encode(x: torch.Tensor) -> torch.Tensor:
    """The model's input channels from raw windows [N, T, F]: each feature, and its change since the window began.

    Devices run at different temperatures and powers, so a reading means most relative to the same
    device's first ``REFERENCE_MIN`` minutes in the window; both the level and the change go in.
    """
    levels = x.clone()
    for index, name in enumerate(FEATURES):
        if name in _LOG_FEATURES:
            # Jitter is a CV of a few hundredths; in percent the logarithm actually compresses its tail.
            unit = 100.0 if name == "step_jitter" else 1.0
            levels[..., index] = torch.log1p(levels[..., index].clamp_min(0.0) * unit)
    reference = levels[:, : min(REFERENCE_MIN, levels.shape[1])].mean(dim=1, keepdim=True)
    return torch.cat([levels, levels - reference], dim=-1)


class FeatureScaler:
    """Per-channel standardisation of ``encode``'d windows, fit on training windows only.

    It is saved with the model: the statistics of the data the model learnt on are part of the model.
    """

    def __init__(self, mean: torch.Tensor, std: torch.Tensor) -> None:
        self.mean = mean
        self.std = std

    @classmethod
    def fit(cls, encoded: torch.Tensor) -> FeatureScaler:
        flat = encoded.reshape(-1, encoded.shape[-1])
        return cls(flat.mean(dim=0), flat.std(dim=0).clamp_min(1e-6))

    def transform(self, encoded: torch.Tensor) -> torch.Tensor:
        return (encoded - self.mean) / self.std

    def state(self) -> dict[str, torch.Tensor]:
        return {"mean": self.mean.clone(), "std": self.std.clone()}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> FeatureScaler:
        return cls(state["mean"].clone(), state["std"].clone())


class WindowClassifier(Protocol):
    """What ``evaluate`` needs: a window length, a horizon, and a yes/no per window."""

    window_min: int
    horizon_min: int

    def predict_many(self, x: torch.Tensor) -> torch.Tensor: ...


def _as_batch(window_samples: Sequence[Sequence[float]], window: int) -> torch.Tensor:
    x = torch.tensor([list(sample) for sample in window_samples], dtype=torch.float32)
    if x.ndim != 2 or x.shape[1] != len(FEATURES):
        raise ValueError(f"a window is a sequence of samples with {len(FEATURES)} features each")
    if x.shape[0] != window:
        raise ValueError(f"expected a window of {window} minutes, got {x.shape[0]}")
    return x.unsqueeze(0)


def best_f1_threshold(scores: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """The threshold on ``scores`` (alert when score >= threshold) with the best F1, and that F1.

    Candidates are the distinct scores themselves; ties in F1 keep the higher threshold (fewer alerts).
    """
    if scores.numel() == 0 or labels.sum() == 0:
        return math.inf, 0.0
    order = torch.argsort(scores, descending=True)
    sorted_scores, sorted_labels = scores[order], labels[order]
    true_positives = torch.cumsum(sorted_labels, 0)
    alerts = torch.arange(1, len(scores) + 1, dtype=torch.float32)
    # Only cut between different scores: everything equal to the threshold alerts together.
    last_of_run = torch.ones(len(scores), dtype=torch.bool)
    last_of_run[:-1] = sorted_scores[:-1] != sorted_scores[1:]
    f1 = 2 * true_positives / (alerts + labels.sum())
    f1 = torch.where(last_of_run, f1, torch.full_like(f1, -1.0))
    best = int(torch.argmax(f1))
    return float(sorted_scores[best]), float(f1[best])


class _Network(nn.Module):
    def __init__(self, inputs: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(inputs, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        output, _ = self.lstm(x)
        last: torch.Tensor = self.head(output[:, -1])
        return last.squeeze(-1)


def _seeded_network(hidden: int, layers: int, seed: int) -> _Network:
    """A freshly initialised network that neither depends on nor disturbs the caller's global torch RNG."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _Network(2 * len(FEATURES), hidden, layers)


def split_for_validation(
    histories: Sequence[DeviceHistory], *, seed: int, validation_share: float = 0.25
) -> tuple[list[DeviceHistory], list[DeviceHistory]]:
    """Split training histories by device into a part to learn from and a part to pick the threshold on.

    By device, not by window: overlapping windows of one device on both sides would flatter the
    threshold.
    """
    order = list(range(len(histories)))
    random.Random(f"{seed}:validation").shuffle(order)  # noqa: S311 (a seeded, repeatable split; no secret)
    cut = round(len(order) * validation_share)
    held = set(order[:cut])
    return [h for i, h in enumerate(histories) if i not in held], [h for i, h in enumerate(histories) if i in held]


class LSTMPredictor:
    """A small LSTM over the last ``window_min`` minutes, with a linear head giving P(failure within horizon)."""

    def __init__(
        self, *, window_min: int = WINDOW_MIN, horizon_min: int = HORIZON_MIN, hidden: int = 32, layers: int = 1
    ) -> None:
        if not 1 <= layers <= 2 or not 1 <= hidden <= 64:
            raise ValueError("the predictor is meant to be small: 1-2 layers, hidden size <= 64")
        self.window_min = window_min
        self.horizon_min = horizon_min
        self.hidden = hidden
        self.layers = layers
        self.network = _seeded_network(hidden, layers, seed=0)
        self.scaler: FeatureScaler | None = None
        self.threshold = 0.5
        self.validation_f1: float | None = None

    def fit(
        self,
        train_histories: Sequence[DeviceHistory],
        *,
        seed: int,
        epochs: int = 8,
        batch_size: int = 256,
        learning_rate: float = 3e-3,
        negatives_per_positive: float = 4.0,
        validation_share: float = 0.25,
    ) -> LSTMPredictor:
        """Learn from ``train_histories``; deterministic given ``seed`` (and the torch thread count).

        A quarter of the devices is kept aside to choose the alert threshold (best F1 on windows as
        they come, positives rare). Each epoch sees every positive window and a fresh random draw of
        ``negatives_per_positive`` times as many negatives, which keeps epochs short; the loss weighs
        positives by the remaining imbalance so neither class dominates.
        """
        fit_part, validation_part = split_for_validation(train_histories, seed=seed, validation_share=validation_share)
        x_raw, y = windows(fit_part, self.window_min, self.horizon_min)
        if y.sum() == 0:
            raise ValueError("the training histories hold no positive windows: nothing fails within the horizon")
        encoded = encode(x_raw)
        self.scaler = FeatureScaler.fit(encoded)
        x = self.scaler.transform(encoded)
        positives = torch.nonzero(y > 0.5).squeeze(1)
        negatives = torch.nonzero(y < 0.5).squeeze(1)
        negatives_per_epoch = min(len(negatives), max(1, round(len(positives) * negatives_per_positive)))
        loss_fn = nn.BCEWithLogitsLoss(pos_weight=torch.tensor(negatives_per_epoch / len(positives)))

        generator = torch.Generator().manual_seed(seed)
        self.network = _seeded_network(self.hidden, self.layers, seed)
        optimizer = torch.optim.Adam(self.network.parameters(), lr=learning_rate)
        self.network.train()
        for _ in range(epochs):
            chosen = negatives[torch.randperm(len(negatives), generator=generator)[:negatives_per_epoch]]
            epoch = torch.cat([positives, chosen])
            epoch = epoch[torch.randperm(len(epoch), generator=generator)]
            for start in range(0, len(epoch), batch_size):
                batch = epoch[start : start + batch_size]
                optimizer.zero_grad()
                loss = loss_fn(self.network(x[batch]), y[batch])
                loss.backward()
                optimizer.step()
        self.network.eval()

        x_val, y_val = windows(validation_part, self.window_min, self.horizon_min)
        self.threshold, self.validation_f1 = best_f1_threshold(self.scores(x_val), y_val)
        if not math.isfinite(self.threshold):
            self.threshold = 0.5  # no positives to tune on: fall back to the natural cut
        return self

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        """Failure probabilities for raw windows [N, window, F]."""
        if self.scaler is None:
            raise RuntimeError("the predictor has not been fitted")
        if len(x) == 0:
            return torch.zeros(0)
        with torch.no_grad():
            return torch.sigmoid(self.network(self.scaler.transform(encode(x))))

    def score(self, window_samples: Sequence[Sequence[float]]) -> float:
        """The probability that this device fails within the horizon, from its last ``window_min`` samples.

        Exactly ``window_min`` samples, oldest first; a device younger than that has no score yet.
        """
        return float(self.scores(_as_batch(window_samples, self.window_min))[0])

    def predict_many(self, x: torch.Tensor) -> torch.Tensor:
        return self.scores(x) >= self.threshold

    def predict(self, window_samples: Sequence[Sequence[float]]) -> bool:
        """Whether to alert: the score reaches the threshold chosen on validation devices."""
        return self.score(window_samples) >= self.threshold

    def state(self) -> dict[str, Any]:
        """Everything needed to rebuild the predictor; plain tensors and numbers, fit for ``torch.save``."""
        if self.scaler is None:
            raise RuntimeError("the predictor has not been fitted")
        return {
            "version": STATE_VERSION,
            "window_min": self.window_min,
            "horizon_min": self.horizon_min,
            "hidden": self.hidden,
            "layers": self.layers,
            "threshold": self.threshold,
            "validation_f1": self.validation_f1,
            "weights": {name: tensor.clone() for name, tensor in self.network.state_dict().items()},
            "scaler": self.scaler.state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LSTMPredictor:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported predictor state version {state.get('version')!r}")
        predictor = cls(
            window_min=int(state["window_min"]),
            horizon_min=int(state["horizon_min"]),
            hidden=int(state["hidden"]),
            layers=int(state["layers"]),
        )
        predictor.network.load_state_dict(state["weights"])
        predictor.network.eval()
        predictor.scaler = FeatureScaler.from_state(state["scaler"])
        predictor.threshold = float(state["threshold"])
        predictor.validation_f1 = state.get("validation_f1")
        return predictor


class ThresholdBaseline:
    """Alert when any feature's recent level stands out from the device's own recent normal.

    Per window and feature: the mean of the last ``recent_min`` minutes minus the mean of the
    window's first ``REFERENCE_MIN`` minutes, in units of that reference's standard deviation (floored
    at the training median, so a quiet device's single error does not count as infinite). One
    threshold per feature, fit on the training histories by coordinate ascent on F1. It is what an
    operator would set up first, and it is the bar the LSTM has to clear.
    """

    def __init__(self, *, window_min: int = WINDOW_MIN, horizon_min: int = HORIZON_MIN, recent_min: int = 5) -> None:
        if not 1 <= recent_min <= window_min - REFERENCE_MIN:
            raise ValueError(f"recent_min must fit in the window after its first {REFERENCE_MIN} (reference) minutes")
        self.window_min = window_min
        self.horizon_min = horizon_min
        self.recent_min = recent_min
        self.scale_floor = torch.ones(len(FEATURES))
        self.thresholds = torch.full((len(FEATURES),), math.inf)

    def _deviation(self, x: torch.Tensor, floor: torch.Tensor) -> torch.Tensor:
        reference = x[:, :REFERENCE_MIN]
        recent = x[:, -self.recent_min :].mean(dim=1)
        return (recent - reference.mean(dim=1)) / torch.maximum(reference.std(dim=1), floor)

    def fit(self, train_histories: Sequence[DeviceHistory], *, rounds: int = 3) -> ThresholdBaseline:
        x, y = windows(train_histories, self.window_min, self.horizon_min)
        self.scale_floor = x[:, :REFERENCE_MIN].std(dim=1).median(dim=0).values.clamp_min(1e-6)
        deviation = self._deviation(x, self.scale_floor)
        quantiles = torch.linspace(0.5, 0.9995, 60)
        candidates: list[torch.Tensor] = [
            torch.unique(torch.quantile(deviation[:, f], quantiles)) for f in range(len(FEATURES))
        ]
        thresholds = torch.full((len(FEATURES),), math.inf)
        best_f1 = 0.0
        for _ in range(rounds):
            for f in range(len(FEATURES)):
                for candidate in [math.inf, *candidates[f].tolist()]:
                    trial = thresholds.clone()
                    trial[f] = candidate
                    f1 = _f1((deviation > trial).any(dim=1), y)
                    if f1 > best_f1:
                        best_f1, thresholds = f1, trial
        self.thresholds = thresholds
        return self

    def predict_many(self, x: torch.Tensor) -> torch.Tensor:
        if len(x) == 0:
            return torch.zeros(0, dtype=torch.bool)
        return (self._deviation(x, self.scale_floor) > self.thresholds).any(dim=1)

    def predict(self, window_samples: Sequence[Sequence[float]]) -> bool:
        return bool(self.predict_many(_as_batch(window_samples, self.window_min))[0])

    def state(self) -> dict[str, Any]:
        return {
            "version": STATE_VERSION,
            "window_min": self.window_min,
            "horizon_min": self.horizon_min,
            "recent_min": self.recent_min,
            "scale_floor": self.scale_floor.clone(),
            "thresholds": self.thresholds.clone(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ThresholdBaseline:
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported baseline state version {state.get('version')!r}")
        baseline = cls(
            window_min=int(state["window_min"]),
            horizon_min=int(state["horizon_min"]),
            recent_min=int(state["recent_min"]),
        )
        baseline.scale_floor = state["scale_floor"].clone()
        baseline.thresholds = state["thresholds"].clone()
        return baseline


def _f1(alerts: torch.Tensor, labels: torch.Tensor) -> float:
    true_positives = float((alerts & (labels > 0.5)).sum())
    denominator = float(alerts.sum()) + float(labels.sum())
    return 2 * true_positives / denominator if denominator else 0.0


@dataclass(frozen=True)
class Evaluation:
    """Per-window scores of a predictor on held-out histories."""

    precision: float
    recall: float
    f1: float
    accuracy: float
    positives: int  # windows followed by a failure within the horizon
    negatives: int
    windows: int
    horizon_min: int

    @property
    def positive_rate(self) -> float:
        """The precision of alerting at random, and the bar "beats chance" is measured against."""
        return self.positives / self.windows if self.windows else 0.0


def evaluate(model: WindowClassifier, histories: Sequence[DeviceHistory]) -> Evaluation:
    """Score every window (stride 1) of the held-out ``histories``."""
    x, y = windows(histories, model.window_min, model.horizon_min)
    alerts = model.predict_many(x)
    truth = y > 0.5
    true_positives = int((alerts & truth).sum())
    alert_count, positives = int(alerts.sum()), int(truth.sum())
    precision = true_positives / alert_count if alert_count else 0.0
    recall = true_positives / positives if positives else 0.0
    return Evaluation(
        precision=precision,
        recall=recall,
        f1=2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        accuracy=float((alerts == truth).float().mean()) if len(y) else 0.0,
        positives=positives,
        negatives=len(y) - positives,
        windows=len(y),
        horizon_min=model.horizon_min,
    )


def alert_lead_time(model: WindowClassifier, history: DeviceHistory) -> int | None:
    """Minutes between the first alert inside the horizon and the failure; None if it came unannounced.

    Only alerts within ``horizon_min`` of the failure count: an earlier one is a false alarm by the
    same definition the per-window figures use.
    """
    if history.fail_at is None:
        raise ValueError("lead times are defined for devices that fail")
    x, y = windows([history], model.window_min, model.horizon_min)
    alerts = model.predict_many(x) & (y > 0.5)
    if not bool(alerts.any()):
        return None
    first_end = model.window_min - 1 + int(torch.nonzero(alerts)[0])
    return history.fail_at - first_end


def visible_share(histories: Sequence[DeviceHistory], window: int = WINDOW_MIN, horizon: int = HORIZON_MIN) -> float:
    """The share of positive windows whose last sample already carries some precursor.

    The rest (every window of a sudden failure, the early windows of a short precursor) look healthy by
    construction, so this share bounds the recall any predictor can honestly reach; it is a loose
    bound, since a faint precursor's first minutes drown in the noise.
    """
    positives = visible = 0
    for history in histories:
        if history.fail_at is None:
            continue
        for end in range(max(window - 1, history.fail_at - horizon), history.fail_at):
            positives += 1
            visible += history.precursor_from is not None and end >= history.precursor_from
    return visible / positives if positives else 0.0


def recall_by_mode(model: WindowClassifier, histories: Sequence[DeviceHistory]) -> dict[str, float]:
    """Per-window recall for each failure mode: which precursors the model reads, and that sudden ones stay unseen."""
    recalls: dict[str, float] = {}
    for mode in sorted({h.mode for h in histories if h.fail_at is not None}):
        x, y = windows([h for h in histories if h.mode == mode], model.window_min, model.horizon_min)
        truth = y > 0.5
        recalls[mode] = float((model.predict_many(x) & truth).sum()) / max(1, int(truth.sum()))
    return recalls


@dataclass(frozen=True)
class EventView:
    """Per-device figures: how many failures were announced, how early, and how often healthy devices cry wolf."""

    failures: int
    announced: int
    median_lead_min: float | None
    false_alerts_per_device_hour: float  # alert onsets on devices that never fail


def event_view(model: WindowClassifier, histories: Sequence[DeviceHistory]) -> EventView:
    failing = [h for h in histories if h.fail_at is not None]
    leads = [lead for lead in (alert_lead_time(model, h) for h in failing) if lead is not None]
    healthy = [h for h in histories if h.fail_at is None]
    onsets, hours = 0, 0.0
    for history in healthy:
        x, _ = windows([history], model.window_min, model.horizon_min)
        alerts = model.predict_many(x).int()
        onsets += int(alerts[0]) + int((alerts[1:] - alerts[:-1]).clamp_min(0).sum()) if len(alerts) else 0
        hours += len(alerts) / 60.0
    return EventView(
        failures=len(failing),
        announced=len(leads),
        median_lead_min=float(sorted(leads)[len(leads) // 2]) if leads else None,
        false_alerts_per_device_hour=onsets / hours if hours else 0.0,
    )


def train_and_evaluate(
    *,
    seed: int = 0,
    train_count: int | None = None,
    test_count: int | None = None,
    epochs: int | None = None,
    quick: bool = False,
) -> dict[str, Any]:
    """Train both predictors on synthetic histories and score them on held-out ones.

    Training and test histories come from disjoint seeds (``2 * seed`` and ``2 * seed + 1``), so no
    device appears on both sides. ``quick`` trades a smaller data set and fewer epochs for speed
    (well under 20 s on two cores); the full run takes longer and is steadier.
    """
    train_count = train_count if train_count is not None else (160 if quick else 400)
    test_count = test_count if test_count is not None else (120 if quick else 400)
    epochs = epochs if epochs is not None else (6 if quick else 8)
    train = generate_histories(train_count, seed=2 * seed)
    test = generate_histories(test_count, seed=2 * seed + 1)

    started, started_cpu = time.perf_counter(), time.process_time()
    predictor = LSTMPredictor().fit(train, seed=seed, epochs=epochs)
    train_s, train_cpu_s = time.perf_counter() - started, time.process_time() - started_cpu
    started = time.perf_counter()
    baseline = ThresholdBaseline().fit(train)
    baseline_train_s = time.perf_counter() - started

    predictor_eval, baseline_eval = evaluate(predictor, test), evaluate(baseline, test)
    return {
        "synthetic": True,
        "models": {"predictor": predictor, "baseline": baseline},
        "predictor": predictor_eval,
        "baseline": baseline_eval,
        "predictor_events": event_view(predictor, test),
        "baseline_events": event_view(baseline, test),
        "predictor_recall_by_mode": recall_by_mode(predictor, test),
        "baseline_recall_by_mode": recall_by_mode(baseline, test),
        "visible_share": visible_share(test, predictor.window_min, predictor.horizon_min),
        "train_s": train_s,  # wall clock: on a shared machine it says as much about the neighbours as the model
        "train_cpu_s": train_cpu_s,
        "baseline_train_s": baseline_train_s,
        "threshold": predictor.threshold,
        "train_histories": train_count,
        "test_histories": test_count,
        "epochs": epochs,
        "positive_rate": predictor_eval.positive_rate,
        "window_min": predictor.window_min,
        "horizon_min": predictor.horizon_min,
    }


def summary(result: dict[str, Any]) -> str:
    """A few lines for a person: both methods side by side, with the caveat that the data is synthetic."""
    lines = [
        f"synthetic histories: {result['train_histories']} train, {result['test_histories']} held out; "
        f"{result['horizon_min']}-minute horizon, {result['window_min']}-minute windows; "
        f"positive rate {result['positive_rate']:.3f}; {result['visible_share']:.3f} of positive windows show any "
        "precursor (a bound on recall)",
    ]
    for name in ("predictor", "baseline"):
        evaluation: Evaluation = result[name]
        events: EventView = result[f"{name}_events"]
        lines.append(
            f"{name:9s} precision {evaluation.precision:.3f} recall {evaluation.recall:.3f} f1 {evaluation.f1:.3f} "
            f"accuracy {evaluation.accuracy:.3f}; announced {events.announced}/{events.failures} failures, "
            f"median lead {events.median_lead_min} min, {events.false_alerts_per_device_hour:.3f} false alerts "
            "per healthy device-hour"
        )
        by_mode = result[f"{name}_recall_by_mode"]
        lines.append(
            "          recall by mode: " + ", ".join(f"{mode} {recall:.2f}" for mode, recall in by_mode.items())
        )
    lines.append(f"LSTM training {result['train_s']:.1f} s wall, {result['train_cpu_s']:.1f} s CPU")
    return "\n".join(lines)


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="Train and score the failure predictor on synthetic histories.")
    parser.add_argument("--quick", action="store_true", help="a smaller run (well under 20 s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the model is small: 1 is usually best)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON too")
    arguments = parser.parse_args()
    torch.set_num_threads(arguments.threads)
    outcome = train_and_evaluate(seed=arguments.seed, quick=arguments.quick)
    # T201: `python -m runtime.recovery.predict` is a command: its figures are its output.
    print(summary(outcome))  # noqa: T201
    if arguments.json:
        figures = {k: asdict(v) if isinstance(v, Evaluation | EventView) else v for k, v in outcome.items()}
        print(json.dumps(figures))  # noqa: T201


@dataclass(frozen=True)
class AlertPolicyView:
    """How an alerting rule on top of a model would behave in operation, per device rather than per window."""

    streak: int  # consecutive alerting windows needed
    stride_min: int  # minutes between two scorings of a device
    false_alerts_per_device_hour: float  # alert episodes on devices that never fail
    failures_warned: float  # share of failing devices alerted before their failure
    failing_devices: int
    healthy_device_hours: float


def alert_policy_view(
    model: LSTMPredictor, histories: Sequence[DeviceHistory], *, streak: int, stride_min: int = 5
) -> AlertPolicyView:
    """Score each device every ``stride_min`` minutes and alert after ``streak`` alerting scores in a row."""
    if streak < 1 or stride_min < 1:
        raise ValueError("streak and stride_min must be at least 1")
    window = model.window_min
    false_alerts = warned = failing = 0
    healthy_minutes = 0
    for history in histories:
        rows = history.samples
        ends = list(range(window, len(rows) + 1, stride_min))
        batch = _as_batch_many([rows[end - window : end] for end in ends], window)
        alerts: list[bool] = [bool(a) for a in model.predict_many(batch)] if ends else []
        run = episodes = 0
        first_alert: int | None = None
        for end, alert in zip(ends, alerts, strict=True):
            run = run + 1 if alert else 0
            if run == streak:
                episodes += 1
                first_alert = end if first_alert is None else first_alert
        if history.fail_at is None:
            false_alerts += episodes
            healthy_minutes += len(rows)
        else:
            failing += 1
            warned += first_alert is not None and first_alert <= history.fail_at
    hours = healthy_minutes / 60.0
    return AlertPolicyView(
        streak=streak,
        stride_min=stride_min,
        false_alerts_per_device_hour=false_alerts / hours if hours else 0.0,
        failures_warned=warned / failing if failing else 0.0,
        failing_devices=failing,
        healthy_device_hours=hours,
    )


def _as_batch_many(windows_rows: Sequence[Sequence[Sequence[float]]], window: int) -> torch.Tensor:
    return torch.cat([_as_batch(rows, window) for rows in windows_rows]) if windows_rows else torch.empty(0)
