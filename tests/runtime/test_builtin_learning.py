"""The real built-in models learn at their defaults: one process trains the way a rank does (the
global batch of each step, cut into uneven slices, each slice's loss sum over B backward) and the
held-out figures reach what issue 18 asks of the mixed gang."""

from __future__ import annotations

import collections
import itertools
import math

from runtime.jobspec import parse_workload
from runtime.worker.builtin import make_task
from runtime.worker.builtin.base import BuiltinTask
from runtime.worker.builtin.charlm import load_corpus


def train(task: BuiltinTask, steps: int, global_batch: int) -> tuple[float, dict[str, float]]:
    """Train ``steps`` steps; the first step's global-batch mean loss and the final held-out figures."""
    model = task.build_model()
    optimizer = task.make_optimizer(list(model.parameters()))
    # Uneven slices, as a balanced gang of three would have them.
    cuts = [0, global_batch // 5, global_batch // 2 + 1, global_batch]
    first_loss = math.nan
    for step in range(steps):
        inputs, targets = task.global_batch_at(step)
        optimizer.zero_grad()
        loss = 0.0
        for lo, hi in itertools.pairwise(cuts):
            chunk = task.loss_sum(model, inputs[lo:hi], targets[lo:hi]) / global_batch
            chunk.backward()
            loss += chunk.item()
        optimizer.step()
        if step == 0:
            first_loss = loss
    return first_loss, task.evaluate(model)


def test_charlm_at_its_defaults_learns_more_than_the_byte_frequencies() -> None:
    spec = parse_workload({"kind": "builtin", "model": "charlm"})
    first_loss, figures = train(make_task(spec), spec.steps, spec.global_batch)

    assert math.isclose(first_loss, math.log(256), rel_tol=0.02)  # a fresh model knows nothing
    assert figures["val_loss"] <= 0.7 * first_loss
    # Knowing only how often each byte occurs (learnt from the training text) scores this on the
    # held-out text; doing better means the model uses the context.
    train_text, heldout_text, _ = load_corpus()
    counts = collections.Counter(train_text)
    unigram = -sum(math.log((counts[b] + 1) / (len(train_text) + 256)) for b in heldout_text) / len(heldout_text)
    assert figures["val_loss"] < unigram - 0.3


def test_digits_cnn_at_its_defaults_classifies_held_out_images() -> None:
    spec = parse_workload({"kind": "builtin", "model": "digits-cnn"})
    first_loss, figures = train(make_task(spec), spec.steps, spec.global_batch)

    assert math.isclose(first_loss, math.log(10), rel_tol=0.1)
    assert figures["val_accuracy"] >= 0.95
    assert figures["val_loss"] <= 0.2 * first_loss
