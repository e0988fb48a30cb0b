"""The built-in "synthetic-mlp" workload: a learnable task made up on the spot from a seed.

A fixed random teacher MLP labels Gaussian inputs (32 dims, 10 classes). Inputs whose top two
teacher logits are close are dropped, so that the classes have margins: the student can drive the
loss well down in a few hundred steps, and tiny floating-point differences between machines cannot
flip a label. Every rank builds the same dataset from the seed; no files, no downloads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import nn

from runtime.worker.config import INPUT_DIM, NUM_CLASSES

__all__ = ["INPUT_DIM", "NUM_CLASSES", "SyntheticDataset", "build_student", "dataset_size", "make_samples"]

TEACHER_HIDDEN = 32
# Enough samples that an epoch spans several dozen steps at the default global batch.
DATASET_TARGET = 4096
# Optimizer constants: plain SGD with momentum is robust for lr from ~0.02 to ~0.2 on this task.
MOMENTUM = 0.9

_STREAM_DATA = 1
_STREAM_EPOCH = 2


def _generator(seed: int, stream: int, index: int = 0) -> torch.Generator:
    # Distinct, reproducible random streams per purpose, so adding one never shifts another.
    mixed = (seed * 1_000_003 + stream * 7_919 + index * 104_729) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


def dataset_size(global_batch: int) -> int:
    """A whole number of global batches, at least DATASET_TARGET samples."""
    batches = max(1, math.ceil(DATASET_TARGET / global_batch))
    return batches * global_batch


class SyntheticDataset:
    """Teacher-labelled data, shuffled per epoch; ``global_batch_at(step)`` is the same on every rank."""

    def __init__(self, seed: int, global_batch: int, size: int | None = None) -> None:
        if global_batch < 1:
            raise ValueError(f"global_batch must be at least 1, got {global_batch}")
        self.seed = seed
        self.global_batch = global_batch
        self.size = size if size is not None else dataset_size(global_batch)
        if self.size % global_batch:
            raise ValueError(f"dataset size {self.size} must be a multiple of the global batch {global_batch}")
        self.batches_per_epoch = self.size // global_batch
        self.inputs, self.labels = make_samples(seed, self.size)
        self._epoch = -1
        self._order = torch.empty(0, dtype=torch.long)

    def indices_at(self, step: int) -> torch.Tensor:
        """Sample indices of the global batch at 0-based ``step``; each epoch visits every sample once."""
        epoch, position = divmod(step, self.batches_per_epoch)
        if epoch != self._epoch:
            self._order = torch.randperm(self.size, generator=_generator(self.seed, _STREAM_EPOCH, epoch))
            self._epoch = epoch
        start = position * self.global_batch
        return self._order[start : start + self.global_batch]

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.indices_at(step)
        return self.inputs[idx], self.labels[idx]


def make_samples(seed: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` inputs and teacher labels, a pure function of (seed, count)."""
    gen = _generator(seed, _STREAM_DATA)
    w1 = torch.randn(INPUT_DIM, TEACHER_HIDDEN, generator=gen) / math.sqrt(INPUT_DIM)
    w2 = torch.randn(TEACHER_HIDDEN, NUM_CLASSES, generator=gen) / math.sqrt(TEACHER_HIDDEN)
    # Draw twice as many candidates and keep the half with the clearest teacher decision.
    candidates = torch.randn(2 * count + 64, INPUT_DIM, generator=gen)
    logits = torch.tanh(candidates @ w1) @ w2
    top2 = logits.topk(2, dim=1).values
    margin = top2[:, 0] - top2[:, 1]
    keep = torch.argsort(margin, descending=True, stable=True)[:count].sort().values
    return candidates[keep].contiguous(), logits[keep].argmax(dim=1)


def build_student(hidden: int, seed: int) -> nn.Module:
    """The model being trained: 32 -> hidden -> hidden -> 10; the same weights for the same seed."""
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(INPUT_DIM, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, NUM_CLASSES),
    )


def make_optimizer(params: Iterable[nn.Parameter], lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=lr, momentum=MOMENTUM)
