"""The one shape every built-in model has (``BuiltinTask``) and the data order they share.

A built-in task is everything a rank needs to train one of Polychip's own models: the initial
model, its optimizer, the global batch of any step, the loss in a form that splits across ranks,
and figures on held-out data. The training loop (``runtime.worker.train``) and the benches only
talk to this protocol, so a new built-in model is a new module here and an entry in
``runtime.jobspec.BUILTIN_MODELS``.

The contract that makes an uneven split exact:

- ``global_batch_at(step)`` is a pure function of (seed, step): every rank computes the same
  global batch and trains on its own slice ``[lo, hi)`` of it.
- ``loss_sum`` is the *sum* over samples of each sample's loss and adds up over any split of the
  batch (no batch statistics, no dropout), so ``sum over ranks of loss_sum / B`` is the mean loss of
  the global batch and its gradient is the single-process gradient.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol

import torch
from torch import nn


class BuiltinTask(Protocol):
    """A built-in model with its data; built by ``runtime.worker.builtin.make_task``."""

    name: str  # the model's name in ``BUILTIN_MODELS``
    batches_per_epoch: int  # global batches per pass over the training set
    eval_every: int  # steps between evaluations worth reporting during training
    param_count: int  # the model's parameters, exactly (``max_micro_batch``'s memory model)
    # Bytes one sample keeps alive for the backward pass (fp32, autograd temporaries included);
    # rough but not flattering, for the memory cap of a micro-batch.
    activation_bytes_per_sample: float

    def build_model(self) -> nn.Module:
        """The initial model: the same weights for the same seed on every process and every call,
        whatever the global random state (it is neither read nor left changed)."""
        ...

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """The optimizer for ``params`` at the spec's learning rate."""
        ...

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of the global batch at 0-based ``step``: exactly ``global_batch``
        samples, the same on every rank; each epoch visits the training samples in a new seeded
        order, none twice."""
        ...

    def loss_sum(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The sum over the samples of each sample's loss (a scalar with a graph): additive over
        any split of the batch."""
        ...

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        """Figures on held-out data never trained on (``val_loss``, and ``val_accuracy`` for the
        classifiers); the model is left in training mode."""
        ...


def stream_generator(seed: int, stream: int, index: int = 0) -> torch.Generator:
    """A reproducible random stream per (seed, purpose, index): adding a stream never shifts another."""
    mixed = (seed * 1_000_003 + stream * 7_919 + index * 104_729) % (2**63 - 1)
    return torch.Generator().manual_seed(mixed)


@contextlib.contextmanager
def seeded_weights(seed: int) -> Iterator[None]:
    """Inside: torch's global random stream seeded with ``seed``; after: as it was before.

    Module constructors draw their initial weights from the global stream, so this is what makes
    ``build_model`` give the same weights for a seed on every process, without disturbing (or
    depending on) whatever the caller did with the global stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


class EpochOrder:
    """Which training samples make the global batch at each step.

    Each epoch is a fresh seeded permutation of all ``size`` samples cut into ``size // global_batch``
    global batches; the ``size % global_batch`` samples left at the end of a permutation wait for a
    later epoch (a different few each time), so every global batch is full and no epoch repeats a
    sample.
    """

    def __init__(self, size: int, global_batch: int, seed: int, stream: int) -> None:
        if global_batch < 1:
            raise ValueError(f"global_batch must be at least 1, got {global_batch}")
        if global_batch > size:
            raise ValueError(f"global_batch {global_batch} is larger than the {size} training samples")
        self.size = size
        self.global_batch = global_batch
        self.seed = seed
        self.stream = stream
        self.batches_per_epoch = size // global_batch
        self._epoch = -1
        self._order = torch.empty(0, dtype=torch.long)

    def epoch_of(self, step: int) -> int:
        return step // self.batches_per_epoch

    def indices_at(self, step: int) -> torch.Tensor:
        if step < 0:
            raise ValueError(f"step is 0-based and non-negative, got {step}")
        epoch, position = divmod(step, self.batches_per_epoch)
        if epoch != self._epoch:  # one permutation per epoch, kept while the steps stay in it
            self._order = torch.randperm(self.size, generator=stream_generator(self.seed, self.stream, epoch))
            self._epoch = epoch
        start = position * self.global_batch
        return self._order[start : start + self.global_batch]


@contextlib.contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """Inside: no gradients and ``model.eval()``; after: training mode again."""
    model.eval()
    try:
        with torch.no_grad():
            yield model
    finally:
        model.train()
