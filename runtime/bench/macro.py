"""Macro-benchmarks: training steps of small models, in samples per second.

Job classes:

- ``resnet-small``: a ResNet for 32x32 RGB images (three stages of one basic block, 16/32/64
  channels), 10 classes, batch 32;
- ``transformer-small``: a 2-layer transformer encoder (d_model 128, 4 heads, feed-forward 256)
  over 64 tokens of a 1,000-token vocabulary, predicting each next token, batch 16;
- ``synthetic-mlp``: the worker's own workload (``runtime.worker.workload``) at the job spec's
  default hidden size and global batch, so its figure is that of a one-device job.

Inputs are random tensors made once from a seed: what is timed is the step (forward, backward,
optimizer), not data loading. After each timed step the given step hooks are called with a
``StepInfo``, exactly as the worker calls them, so that a backend's emulation applies here as it
does to real jobs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from runtime.jobspec import WorkloadSpec
from runtime.worker.config import StepHook, StepInfo
from runtime.worker.workload import SyntheticDataset, build_student, make_optimizer

WARMUP_STEPS = 2
MIN_TIMED_STEPS = 3


class BasicBlock(nn.Module):
    def __init__(self, channels_in: int, channels_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels_out)
        self.conv2 = nn.Conv2d(channels_out, channels_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or channels_in != channels_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(channels_in, channels_out, 1, stride=stride, bias=False), nn.BatchNorm2d(channels_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class SmallResNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.stages = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2))
        self.head = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.stages(self.stem(x)).mean(dim=(2, 3)))
        return logits


class SmallTransformer(nn.Module):
    def __init__(self, vocab: int = 1000, d_model: int = 128, heads: int = 4, ff: int = 256, layers: int = 2) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(seq)
        logits: torch.Tensor = self.head(self.encoder(self.embed(tokens), mask=causal, is_causal=True))
        return logits


@dataclass(frozen=True)
class Workload:
    """A model, its optimizer and the loss over a fixed batch; ``step`` takes one training step."""

    job_class: str
    batch: int
    model: nn.Module
    optimizer: torch.optim.Optimizer
    loss: Callable[[], torch.Tensor]

    def step(self) -> float:
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss()
        loss.backward()  # type: ignore[no-untyped-call]  # torch.Tensor.backward has no annotations
        self.optimizer.step()
        return float(loss.detach())


def _sgd(model: nn.Module, lr: float = 0.05) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def resnet_small(batch: int = 32, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    model = SmallResNet()
    gen = torch.Generator().manual_seed(seed)
    images = torch.randn(batch, 3, 32, 32, generator=gen)
    labels = torch.randint(0, 10, (batch,), generator=gen)
    return Workload("resnet-small", batch, model, _sgd(model), lambda: F.cross_entropy(model(images), labels))


def transformer_small(batch: int = 16, seq: int = 64, vocab: int = 1000, seed: int = 0) -> Workload:
    torch.manual_seed(seed)
    model = SmallTransformer(vocab=vocab)
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=gen)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def loss() -> torch.Tensor:
        return F.cross_entropy(model(inputs).reshape(-1, vocab), targets.reshape(-1))

    return Workload("transformer-small", batch, model, _sgd(model), loss)


def synthetic_mlp(spec: WorkloadSpec | None = None) -> Workload:
    spec = spec or WorkloadSpec()
    dataset = SyntheticDataset(spec.seed, spec.global_batch)
    model = build_student(spec.hidden, spec.seed)
    inputs, labels = dataset.global_batch_at(0)
    optimizer = make_optimizer(model.parameters(), spec.lr)
    return Workload(
        "synthetic-mlp", spec.global_batch, model, optimizer, lambda: F.cross_entropy(model(inputs), labels)
    )


WORKLOADS: dict[str, Callable[[], Workload]] = {
    "resnet-small": resnet_small,
    "transformer-small": transformer_small,
    "synthetic-mlp": synthetic_mlp,
}


@dataclass(frozen=True)
class TrainingRate:
    """Samples per second of one job class's training steps on one device."""

    job_class: str
    samples_per_s: float
    batch: int
    steps: int  # timed steps, after WARMUP_STEPS untimed ones
    seconds: float
    final_loss: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_class": self.job_class,
            "samples_per_s": self.samples_per_s,
            "batch": self.batch,
            "steps": self.steps,
            "seconds": self.seconds,
            "final_loss": self.final_loss,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TrainingRate:
        return cls(
            raw["job_class"], raw["samples_per_s"], raw["batch"], raw["steps"], raw["seconds"], raw["final_loss"]
        )


def training_rate(workload: Workload, budget_s: float = 1.0, step_hooks: Sequence[StepHook] = ()) -> TrainingRate:
    """Train until ``budget_s`` passed (and at least MIN_TIMED_STEPS): batch / the median timed step.

    The hooks run after every step, warm-up included, and their time counts: they stand for what
    the backend adds to a step (the local backend pads it to its emulated duration).
    """
    workload.model.train()
    loss = float("nan")

    def one_step(number: int, total: int) -> float:
        started = time.monotonic()
        result = workload.step()
        info = StepInfo(
            step=number,
            total_steps=total,
            samples=workload.batch,
            compute_time_s=time.monotonic() - started,
            started_at=started,
        )
        for hook in step_hooks:
            hook(info)
        return result

    for number in range(1, WARMUP_STEPS + 1):
        loss = one_step(number, 0)
    durations: list[float] = []
    started = time.perf_counter()
    while True:
        step_started = time.perf_counter()
        loss = one_step(WARMUP_STEPS + len(durations) + 1, 0)
        durations.append(time.perf_counter() - step_started)
        seconds = time.perf_counter() - started
        if seconds >= budget_s and len(durations) >= MIN_TIMED_STEPS:
            break
    # The median step, not the mean: on a shared host one step stalled by another process would
    # otherwise decide a short benchmark's figure.
    median = statistics.median(durations)
    return TrainingRate(workload.job_class, workload.batch / median, workload.batch, len(durations), seconds, loss)
