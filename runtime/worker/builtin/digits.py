"""``digits-cnn``: a small convolutional network on scikit-learn's bundled handwritten digits.

``sklearn.datasets.load_digits`` ships 1,797 grey 8x8 images of the digits 0-9 inside the package
(nothing is downloaded). Pixels (0-16) are scaled to [0, 1]. A fixed split, the same for every job
whatever its seed, keeps ``HELDOUT_IMAGES`` images apart for evaluation and trains on the rest.

The model (``DigitsCnn``, width ``c = spec.hidden``): 3x3 convolution 1 -> c, ReLU, 3x3 convolution
c -> 2c, ReLU, 2x2 max-pool, a linear head from the 2c x 4 x 4 map to 10 logits. No normalisation
layer and no dropout, so an image's loss does not depend on the other images of its batch. Adam at
``spec.lr``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from runtime.jobspec import WorkloadSpec
from runtime.worker.builtin.base import EpochOrder, evaluating, seeded_weights, stream_generator
from runtime.worker.builtin.shapes import DIGITS_CLASSES, DIGITS_SIDE, memory_figures

HELDOUT_IMAGES = 360  # about 20% of the 1,797
SPLIT_SEED = 1797  # the split is a property of the data set, not of a job
_STREAM_SPLIT = 21
_STREAM_ORDER = 22


@functools.cache
def load_split() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train images, train labels, held-out images, held-out labels); images (n, 1, 8, 8) in [0, 1]."""
    from sklearn.datasets import load_digits  # imported on first use: scikit-learn is slow to import

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).div_(16.0).unsqueeze(1)
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=stream_generator(SPLIT_SEED, _STREAM_SPLIT))
    heldout, train = order[:HELDOUT_IMAGES], order[HELDOUT_IMAGES:]
    return images[train], labels[train], images[heldout], labels[heldout]


class DigitsCnn(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, channels, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(channels, 2 * channels, kernel_size=3, padding=1)
        self.head = nn.Linear(2 * channels * (DIGITS_SIDE // 2) ** 2, DIGITS_CLASSES)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(images))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        logits: torch.Tensor = self.head(x.flatten(1))
        return logits


class DigitsCnnTask:
    """Digit classification; figures: ``val_loss`` and ``val_accuracy`` on the held-out images."""

    name = "digits-cnn"
    eval_every = 25

    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self.train_images, self.train_labels, self.heldout_images, self.heldout_labels = load_split()
        self.order = EpochOrder(len(self.train_labels), spec.global_batch, spec.seed, _STREAM_ORDER)
        self.batches_per_epoch = self.order.batches_per_epoch
        self.param_count, self.activation_bytes_per_sample = memory_figures(self.name, spec.hidden)

    def build_model(self) -> nn.Module:
        with seeded_weights(self.spec.seed):
            return DigitsCnn(self.spec.hidden)

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adam(params, lr=self.spec.lr)

    def global_batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.order.indices_at(step)
        return self.train_images[idx], self.train_labels[idx]

    def loss_sum(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(inputs), targets, reduction="sum")

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        with evaluating(model):
            logits = model(self.heldout_images)
            loss = F.cross_entropy(logits, self.heldout_labels).item()
            accuracy = (logits.argmax(dim=1) == self.heldout_labels).float().mean().item()
        return {"val_loss": loss, "val_accuracy": accuracy}
