"""``synthetic-mlp`` as a ``BuiltinTask``: an adapter over ``runtime.worker.workload``.

Its numbers are those of the worker before there were several models (same data, same initial
weights, same optimizer, same loss), which the exactness tests rely on; this module only adds the
protocol's shape and a held-out evaluation.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from runtime.jobspec import WorkloadSpec
from runtime.worker import workload
from runtime.worker.builtin.base import evaluating, seeded_weights, stream_generator
from runtime.worker.builtin.shapes import memory_figures

# Held-out samples: labelled by the training set's teacher, drawn from a stream the training data
# never uses (``workload`` uses streams 1 and 2).
HELDOUT_STREAM = 101
HELDOUT_SAMPLES = 2048


class SyntheticMlpTask:
    """The teacher-student MLP (``runtime.worker.workload``)."""

    name = "synthetic-mlp"
    eval_every = 50

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self.dataset = workload.SyntheticDataset(spec.seed, spec.global_batch)
        self.batches_per_epoch = self.dataset.batches_per_epoch
        self.param_count, self.activation_bytes_per_sample = memory_figures(self.name, spec.hidden)
        self._heldout: tuple[torch.Tensor, torch.Tensor] | None = None

    def build_model(self) -> nn.Module:
        with seeded_weights(self.spec.seed):  # build_student seeds the global stream itself
            return workload.build_student(self.spec.hidden, self.spec.seed)

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return workload.make_optimizer(params, self.spec.lr)

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.dataset.global_batch_at(step)

    def loss_sum(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(inputs), targets, reduction="sum")

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        inputs, labels = self.heldout()
        with evaluating(model):
            logits = model(inputs)
            loss = F.cross_entropy(logits, labels).item()
            accuracy = (logits.argmax(dim=1) == labels).float().mean().item()
        return {"val_loss": loss, "val_accuracy": accuracy}

    def heldout(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Fresh inputs the training set does not contain, labelled by its teacher and filtered by
        the same margin rule (the clearer half of twice as many candidates)."""
        if self._heldout is None:
            w1, w2 = teacher(self.spec.seed)
            candidates = torch.randn(
                2 * HELDOUT_SAMPLES, workload.INPUT_DIM, generator=stream_generator(self.spec.seed, HELDOUT_STREAM)
            )
            logits = torch.tanh(candidates @ w1) @ w2
            top2 = logits.topk(2, dim=1).values
            keep = torch.argsort(top2[:, 0] - top2[:, 1], descending=True, stable=True)[:HELDOUT_SAMPLES]
            self._heldout = candidates[keep].contiguous(), logits[keep].argmax(dim=1)
        return self._heldout


def teacher(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's weights that ``workload.make_samples`` draws first from its data stream (a test
    checks that they label the training set exactly as the dataset does)."""
    gen = stream_generator(seed, stream=1)
    w1 = torch.randn(workload.INPUT_DIM, workload.TEACHER_HIDDEN, generator=gen) / math.sqrt(workload.INPUT_DIM)
    w2 = torch.randn(workload.TEACHER_HIDDEN, workload.NUM_CLASSES, generator=gen) / math.sqrt(workload.TEACHER_HIDDEN)
    return w1, w2
