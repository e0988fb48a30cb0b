"""The built-in models' contract: the same batches and weights everywhere, full batches that visit
every sample once per epoch, and a loss that adds up over any split of the global batch."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch

from runtime.jobspec import WorkloadSpec
from runtime.worker.builtin import MODELS, make_task
from runtime.worker.builtin.base import BuiltinTask, EpochOrder
from runtime.worker.builtin.charlm import CharLmTask
from runtime.worker.builtin.shapes import CHARLM_CONTEXT, memory_figures, param_shapes
from runtime.worker.builtin.synthetic import SyntheticMlpTask, teacher
from runtime.worker.workload import SyntheticDataset, build_student

# Small widths and batches keep these fast; the learning tests use the real defaults.
SMALL: dict[str, dict[str, Any]] = {
    "synthetic-mlp": {"global_batch": 24, "hidden": 16, "lr": 0.05},
    "charlm": {"global_batch": 6, "hidden": 32, "lr": 0.003},
    "digits-cnn": {"global_batch": 20, "hidden": 8, "lr": 0.01},
}


def small_task(model: str, seed: int = 3) -> BuiltinTask:
    return make_task(WorkloadSpec(kind="builtin", model=model, seed=seed, steps=10, **SMALL[model]))


def assert_same_state(a: torch.nn.Module, b: torch.nn.Module) -> None:
    state_a, state_b = a.state_dict(), b.state_dict()
    assert state_a.keys() == state_b.keys()
    for key in state_a:
        assert torch.equal(state_a[key], state_b[key]), key


@pytest.mark.parametrize("model", MODELS)
def test_two_instances_of_a_task_agree_on_batches_weights_and_figures(model: str) -> None:
    one, two = small_task(model), small_task(model)
    # Steps in the first epoch, at its end and in the next one, asked in a different order.
    steps = [0, 1, one.batches_per_epoch - 1, one.batches_per_epoch, one.batches_per_epoch + 2]
    for step in steps + steps[::-1]:
        x1, y1 = one.global_batch_at(step)
        x2, y2 = two.global_batch_at(step)
        assert torch.equal(x1, x2) and torch.equal(y1, y2), step
    model_one, model_two = one.build_model(), two.build_model()
    assert_same_state(model_one, model_two)
    assert one.evaluate(model_one) == two.evaluate(model_two)


@pytest.mark.parametrize("model", MODELS)
def test_build_model_gives_the_same_weights_each_call_and_leaves_the_global_stream_alone(model: str) -> None:
    task = small_task(model)
    torch.manual_seed(1234)
    expected_draw = torch.rand(4)
    torch.manual_seed(1234)
    first = task.build_model()
    assert torch.equal(torch.rand(4), expected_draw)
    torch.manual_seed(99)  # whatever the caller did before, the weights are the seed's
    assert_same_state(first, task.build_model())
    other_seed = small_task(model, seed=4).build_model()
    assert any(not torch.equal(p, q) for p, q in zip(first.parameters(), other_seed.parameters(), strict=True))


@pytest.mark.parametrize("model", MODELS)
def test_the_optimizer_uses_the_spec_learning_rate(model: str) -> None:
    task = small_task(model)
    optimizer = task.make_optimizer(list(task.build_model().parameters()))
    assert optimizer.param_groups[0]["lr"] == SMALL[model]["lr"]


def test_global_batches_have_the_promised_shapes() -> None:
    chars = small_task("charlm")
    inputs, targets = chars.global_batch_at(5)
    assert inputs.shape == targets.shape == (6, CHARLM_CONTEXT) and inputs.dtype == torch.long
    assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the next bytes
    assert int(inputs.min()) >= 0 and int(inputs.max()) < 256

    images, labels = small_task("digits-cnn").global_batch_at(5)
    assert images.shape == (20, 1, 8, 8) and labels.shape == (20,)
    assert float(images.min()) >= 0.0 and float(images.max()) <= 1.0
    assert set(labels.tolist()) <= set(range(10))

    features, classes = small_task("synthetic-mlp").global_batch_at(5)
    assert features.shape == (24, 32) and classes.shape == (24,)


def test_an_epoch_visits_every_sample_once_in_a_new_order_each_time() -> None:
    order = EpochOrder(size=10, global_batch=3, seed=0, stream=5)
    assert order.batches_per_epoch == 3
    epochs = [torch.cat([order.indices_at(e * 3 + p) for p in range(3)]).tolist() for e in range(4)]
    for visited in epochs:
        assert len(visited) == len(set(visited)) == 9  # one sample of the ten waits for a later epoch
    assert len({tuple(e) for e in epochs}) == 4
    assert set().union(*epochs) == set(range(10))


def test_an_order_refuses_a_batch_larger_than_the_data_and_a_negative_step() -> None:
    with pytest.raises(ValueError, match="larger than"):
        EpochOrder(size=4, global_batch=5, seed=0, stream=1)
    with pytest.raises(ValueError, match="non-negative"):
        EpochOrder(size=4, global_batch=2, seed=0, stream=1).indices_at(-1)


def test_charlm_cuts_the_training_text_into_disjoint_windows_per_epoch() -> None:
    task = small_task("charlm")
    assert isinstance(task, CharLmTask)
    bpe = task.batches_per_epoch
    for epoch in range(2):
        starts = torch.cat([task.window_starts(epoch * bpe + p) for p in range(bpe)]).sort().values
        assert len(starts) == bpe * 6
        assert len(set((starts % CHARLM_CONTEXT).tolist())) == 1  # one offset per epoch
        assert bool((starts.diff() >= CHARLM_CONTEXT).all())  # no window overlaps another
        assert int(starts.max()) + CHARLM_CONTEXT + 1 <= len(task.train_tokens)
    assert len({task.epoch_offset(epoch) for epoch in range(6)}) > 1  # epochs cut the text differently


@pytest.mark.parametrize("model", MODELS)
def test_the_loss_sum_and_its_gradient_add_up_over_an_uneven_split(model: str) -> None:
    task = small_task(model)
    net = task.build_model()
    inputs, targets = task.global_batch_at(2)
    whole = task.loss_sum(net, inputs, targets)
    whole.backward()
    whole_grads = [p.grad.clone() for p in net.parameters() if p.grad is not None]
    net.zero_grad()
    cuts = [0, 1, len(inputs) // 2 + 1, len(inputs)]
    parts = torch.zeros(())
    for lo, hi in itertools.pairwise(cuts):
        part = task.loss_sum(net, inputs[lo:hi], targets[lo:hi])
        part.backward()
        parts += part.detach()
    torch.testing.assert_close(parts, whole.detach(), rtol=1e-5, atol=1e-6)
    split_grads = [p.grad for p in net.parameters() if p.grad is not None]
    for got, expected in zip(split_grads, whole_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("model", MODELS)
def test_evaluation_reports_its_figures_and_leaves_training_mode(model: str) -> None:
    task = small_task(model)
    net = task.build_model()
    figures = task.evaluate(net)
    expected = {"val_loss"} if model == "charlm" else {"val_loss", "val_accuracy"}
    assert figures.keys() == expected
    assert all(isinstance(v, float) and v >= 0 for v in figures.values())
    assert net.training and all(p.grad is None for p in net.parameters())


@pytest.mark.parametrize(
    ("model", "hidden"), [("synthetic-mlp", 16), ("charlm", 32), ("charlm", 40), ("digits-cnn", 8)]
)
def test_the_memory_figures_count_the_real_parameters(model: str, hidden: int) -> None:
    spec = WorkloadSpec(kind="builtin", model=model, hidden=hidden, global_batch=4)
    task = make_task(spec)
    params, activation_bytes = memory_figures(model, hidden)
    assert task.param_count == params == sum(p.numel() for p in task.build_model().parameters())
    assert task.activation_bytes_per_sample == activation_bytes > 0
    # The shapes the control plane sizes the gradient exchange by, without building the model.
    assert param_shapes(model, hidden) == [tuple(p.shape) for p in task.build_model().parameters()]


def test_synthetic_mlp_is_the_workload_it_always_was() -> None:
    spec = WorkloadSpec(kind="builtin", model="synthetic-mlp", global_batch=96, hidden=64, seed=7)
    task = make_task(spec)
    dataset = SyntheticDataset(7, 96)
    for step in (0, 3, dataset.batches_per_epoch + 1):
        got, expected = task.global_batch_at(step), dataset.global_batch_at(step)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    assert_same_state(task.build_model(), build_student(64, 7))


def test_synthetic_mlp_holds_out_fresh_samples_labelled_by_the_same_teacher() -> None:
    task = small_task("synthetic-mlp")
    assert isinstance(task, SyntheticMlpTask)
    w1, w2 = teacher(task.spec.seed)
    train = task.dataset
    assert torch.equal((torch.tanh(train.inputs @ w1) @ w2).argmax(dim=1), train.labels)
    heldout_inputs, heldout_labels = task.heldout()
    assert len(set(heldout_labels.tolist())) > 1
    assert not bool((torch.cdist(heldout_inputs, train.inputs).min(dim=1).values < 1e-6).any())


@pytest.mark.parametrize("model", ["resnet50", "", "Charlm"])
def test_an_unknown_model_is_refused_naming_the_choices(model: str) -> None:
    with pytest.raises(ValueError, match="synthetic-mlp, charlm, digits-cnn"):
        make_task(WorkloadSpec(kind="builtin", model=model))


def test_a_workload_of_another_kind_is_not_a_builtin_task() -> None:
    with pytest.raises(ValueError, match="not a built-in model"):
        make_task(WorkloadSpec(kind="python", model=""))
