"""Pure pieces of the worker: splits, config validation, loss scaling, the synthetic dataset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from runtime.worker import ConfigError, WorkerConfig, equal_split, loss_scale, parse_config, slice_bounds
from runtime.worker.workload import NUM_CLASSES, SyntheticDataset, build_student, dataset_size, make_samples


def _raw(**changes: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {
        "job_id": "j",
        "rank": 1,
        "world_size": 3,
        "master_addr": "127.0.0.1",
        "master_port": 29500,
        "flavor": "h100-sxm",
        "device_id": "gpu-h100-0/1",
        "workload": {"steps": 5, "global_batch": 96},
        "telemetry_url": None,
        "telemetry_token": "",
        "artifacts_dir": "/tmp/a",
        "telemetry_file": None,
    }
    raw.update(changes)
    return raw


@pytest.mark.parametrize(
    ("batch", "world", "expected"),
    [(96, 3, (32, 32, 32)), (10, 3, (4, 3, 3)), (5, 5, (1, 1, 1, 1, 1)), (7, 1, (7,)), (2, 4, (1, 1, 0, 0))],
)
def test_equal_split_is_as_even_as_possible(batch: int, world: int, expected: tuple[int, ...]) -> None:
    assert equal_split(batch, world) == expected


def test_equal_split_rejects_an_empty_world() -> None:
    with pytest.raises(ValueError, match="world_size"):
        equal_split(10, 0)


@pytest.mark.parametrize("split", [(10, 30, 56), (0, 40, 56), (96,), (1, 0, 0, 95)])
def test_slices_are_disjoint_and_cover_the_global_batch(split: tuple[int, ...]) -> None:
    covered: list[int] = []
    for rank, size in enumerate(split):
        lo, hi = slice_bounds(split, rank)
        assert hi - lo == size
        covered.extend(range(lo, hi))
    assert covered == list(range(sum(split)))


def test_a_config_without_micro_batches_splits_equally_and_round_trips() -> None:
    config = parse_config(_raw())
    assert config.micro_batches == (32, 32, 32) and config.micro_batch == 32
    assert config.workload.global_batch == 96 and config.workload.lr == 0.05
    assert parse_config(json.loads(json.dumps(config.to_dict()))) == config


def test_a_config_takes_an_uneven_split() -> None:
    assert parse_config(_raw(micro_batches=[10, 30, 56])).micro_batch == 30


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"micro_batches": [10, 30, 50]}, "micro_batches"),
        ({"micro_batches": [48, 48]}, "micro_batches"),
        ({"micro_batches": [-1, 41, 56]}, "micro_batches"),
        ({"micro_batches": "32,32,32"}, "micro_batches"),
        ({"rank": 3}, "rank"),
        ({"world_size": 0}, "world_size"),
        ({"master_port": 70000}, "master_port"),
        ({"rank": True}, "rank"),
        ({"workload": {"steps": 0}}, "workload.steps"),
        ({"workload": {"layers": 3}}, "workload.layers"),
        ({"collective_timeout_s": -1}, "collective_timeout_s"),
    ],
)
def test_a_bad_config_names_the_key(changes: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_raw(**changes))
    assert info.value.field == key


def test_a_missing_key_is_named() -> None:
    raw = _raw()
    del raw["master_port"]
    with pytest.raises(ConfigError, match="master_port: missing"):
        parse_config(raw)


def test_the_loss_scaling_gives_the_global_mean_gradient_for_any_split() -> None:
    # Emulate DDP by hand: each rank's gradient of sum * scale, averaged over ranks.
    torch.manual_seed(0)
    inputs, labels = torch.randn(96, 32), torch.randint(0, NUM_CLASSES, (96,))
    model = build_student(16, seed=1)
    model.zero_grad()
    F.cross_entropy(model(inputs), labels).backward()
    expected = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    split = (10, 30, 56)
    averaged = [torch.zeros_like(g) for g in expected]
    for rank in range(len(split)):
        lo, hi = slice_bounds(split, rank)
        model.zero_grad()
        loss = F.cross_entropy(model(inputs[lo:hi]), labels[lo:hi], reduction="sum") * loss_scale(3, 96)
        loss.backward()
        for acc, p in zip(averaged, model.parameters(), strict=True):
            assert p.grad is not None
            acc += p.grad / len(split)
    for got, want in zip(averaged, expected, strict=True):
        # torch.allclose, not torch.testing: the latter costs seconds of imports on first use.
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-7), (got - want).abs().max()


def test_the_dataset_is_a_pure_function_of_the_seed() -> None:
    a, b, other = SyntheticDataset(5, 96), SyntheticDataset(5, 96), SyntheticDataset(6, 96)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.inputs, other.inputs)
    for step in (0, 1, a.batches_per_epoch, 3 * a.batches_per_epoch + 2):
        assert torch.equal(a.indices_at(step), b.indices_at(step))
    # The generator for one step does not depend on which steps were visited before.
    fresh = SyntheticDataset(5, 96)
    assert torch.equal(fresh.indices_at(3 * a.batches_per_epoch + 2), a.indices_at(3 * a.batches_per_epoch + 2))


def test_an_epoch_visits_every_sample_once_and_the_next_reshuffles() -> None:
    data = SyntheticDataset(0, 96)
    assert data.size == dataset_size(96) and data.size % 96 == 0 and data.size >= 4096
    epoch0 = torch.cat([data.indices_at(s) for s in range(data.batches_per_epoch)])
    epoch1 = torch.cat([data.indices_at(s) for s in range(data.batches_per_epoch, 2 * data.batches_per_epoch)])
    assert torch.equal(epoch0.sort().values, torch.arange(data.size))
    assert torch.equal(epoch1.sort().values, torch.arange(data.size))
    assert not torch.equal(epoch0, epoch1)


def test_the_labels_have_structure() -> None:
    inputs, labels = make_samples(0, 2000)
    assert inputs.shape == (2000, 32) and labels.shape == (2000,)
    counts = torch.bincount(labels, minlength=NUM_CLASSES)
    assert (counts > 0).sum() >= 8  # most classes occur
    # A linear probe fitted in closed form already beats chance by far: labels follow the inputs.
    onehot = F.one_hot(labels, NUM_CLASSES).float()
    x = torch.cat([inputs, torch.ones(2000, 1)], dim=1)
    weights = torch.linalg.lstsq(x, onehot).solution
    accuracy = ((x @ weights).argmax(1) == labels).float().mean().item()
    assert accuracy > 0.4


def test_the_student_starts_from_the_same_weights_for_the_same_seed() -> None:
    a, b = build_student(24, seed=3).state_dict(), build_student(24, seed=3).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["0.weight"].shape == (24, 32) and a["4.weight"].shape == (10, 24)


def test_worker_config_is_frozen() -> None:
    config = parse_config(_raw())
    assert isinstance(config, WorkerConfig)
    with pytest.raises(AttributeError):
        config.rank = 2  # type: ignore[misc]


def test_a_balanced_config_starts_from_the_balancers_split_and_round_trips() -> None:
    from runtime.balancing import BalancerConfig
    from runtime.worker.config import initial_split, make_balancer

    config = parse_config(_raw(balancing={"mode": "dynamic"}, scores=[1, 2, 4], caps=[10, 20, 30]))
    assert config.balancing == BalancerConfig(mode="dynamic")
    split = initial_split(config)
    # Caps hold 60 of 96 samples per micro-step: two accumulation chunks, each by score within the caps.
    assert split.accumulation == 2 and split.per_rank() == config.micro_batches == (14, 28, 54)
    assert all(chunk[r] <= cap for chunk in split.chunks for r, cap in enumerate((10, 20, 30)))
    assert parse_config(json.loads(json.dumps(config.to_dict()))) == config
    balancer = make_balancer(config)
    assert balancer is not None and balancer.split == split
    # Equal ignores the scores; no scores at all means equal scores.
    assert parse_config(_raw(balancing={"mode": "equal"}, scores=[1, 2, 4])).micro_batches == (32, 32, 32)
    assert parse_config(_raw(balancing={"mode": "static"})).micro_batches == (32, 32, 32)


def test_a_fixed_split_with_accumulation_is_kept_and_never_balanced() -> None:
    from runtime.worker.config import initial_split, make_balancer

    config = parse_config(_raw(split=[[5, 10, 20], [10, 20, 31]]))
    assert config.micro_batches == (15, 30, 51) and make_balancer(config) is None
    assert initial_split(config).slices(1) == [(5, 15), (45, 65)]
    assert parse_config(json.loads(json.dumps(config.to_dict()))) == config
    # The old way, micro_batches alone, is one chunk.
    assert initial_split(parse_config(_raw(micro_batches=[10, 30, 56]))).chunks == ((10, 30, 56),)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"balancing": {"mode": "fastest"}}, "balancing.mode"),
        ({"balancing": {"patience": 0}}, "balancing.patience"),
        ({"balancing": {"speed": 1}}, "balancing.speed"),
        ({"balancing": "dynamic"}, "balancing"),
        ({"scores": [1, 2]}, "scores"),
        ({"scores": [1, 0, 2]}, "scores"),
        ({"caps": [10, 0, None]}, "caps"),
        ({"caps": [10, 10]}, "caps"),
        ({"split": [[10, 30, 50]]}, "split"),
        ({"split": [[48, 48]]}, "split"),
        ({"split": [[10, 30, 56]], "micro_batches": [32, 32, 32]}, "micro_batches"),
        ({"split": [[10, 30, 56]], "balancing": {"mode": "static"}}, "split"),
        ({"balancing": {"mode": "static"}, "scores": [1, 1, 1], "micro_batches": [10, 30, 56]}, "micro_batches"),
    ],
)
def test_a_bad_balancing_config_names_the_key(changes: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_raw(**changes))
    assert info.value.field == key


def test_the_memory_model_caps_micro_batches_by_device_memory() -> None:
    from runtime.jobspec import WorkloadSpec
    from runtime.worker.config import memory_cap, synthetic_mlp_activation_bytes, synthetic_mlp_param_count

    model = build_student(64, seed=0)
    assert synthetic_mlp_param_count(64) == sum(p.numel() for p in model.parameters())
    assert memory_cap(WorkloadSpec(hidden=64), None) is None
    small, big = memory_cap(WorkloadSpec(hidden=64), 0.001), memory_cap(WorkloadSpec(hidden=64), 0.002)
    assert small is not None and big is not None and big > 2 * small  # the model state is paid once
    budget = 0.7 * 0.001 * 2**30 - 16 * synthetic_mlp_param_count(64)
    assert small == int(budget // synthetic_mlp_activation_bytes(64))


def test_a_rank_that_learned_of_the_stop_from_its_peers_reports_the_reason_asked(tmp_path: Path) -> None:
    """The control file appeared between two ranks' reads: the late rank stops on the all-reduce's word,
    and still names the reason the stop was asked for (it used to say "another rank was asked to stop")."""
    from runtime.sdk.context import TrainingContext
    from runtime.worker.checkpointing import Stopped

    control = tmp_path / "control.json"
    control.write_text(json.dumps({"action": "stop", "reason": "node drained by an operator"}))
    config = parse_config(_raw(control_file=str(control)))
    with pytest.raises(Stopped, match="after step 7 with a full checkpoint: node drained by an operator"):
        TrainingContext(config)._stop_after(7, 0.5, None)
