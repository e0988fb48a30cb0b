"""Benchmarks: each figure has the right shape (the ones that start processes are in tests/runtime)."""

from __future__ import annotations

import json
import time

import pytest

from runtime.bench import micro
from runtime.bench.macro import WORKLOADS, resnet_small, synthetic_mlp, training_rate, transformer_small
from runtime.bench.micro import host_device_copy_gbps, matmul_tflops, memory_bandwidth_gbps
from runtime.bench.suite import SuiteResult, benchmark_entries, run_suite, seed_table
from runtime.throughput import Source
from runtime.worker.config import StepInfo


def test_a_tiny_matmul_gives_tflops_with_its_size():
    m = matmul_tflops("fp32", budget_s=0.2)
    assert m.name == "matmul_tflops.fp32" and m.unit == "TFLOP/s"
    assert m.value is not None and m.value > 0 and m.detail["size"] >= 128 and m.detail["calls"] >= 3
    with pytest.raises(ValueError, match="dtype"):
        matmul_tflops("int4")


def test_one_call_is_timed_by_its_fastest_sample_not_by_one_that_waited_for_the_cpu():
    delays = iter([0.0, 0.3, 0.0, 0.0])  # the warm-up call, then one sample that lost its time slice

    def call() -> None:
        time.sleep(next(delays))

    assert micro._one_call_s(call) < 0.1


def test_memory_and_copy_figures():
    m = memory_bandwidth_gbps(megabytes=4, budget_s=0.02)
    assert m.value is not None and m.value > 0 and m.detail["counts"] == "read + write"
    copies = {c.name: c for c in host_device_copy_gbps(megabytes=4, budget_s=0.02)}
    assert set(copies) == {"host_device_copy_gbps.pageable", "host_device_copy_gbps.pinned"}
    pageable = copies["host_device_copy_gbps.pageable"]
    assert pageable.value is not None and pageable.value > 0 and pageable.detail["what"]


@pytest.mark.parametrize("build", [resnet_small, transformer_small, synthetic_mlp])
def test_each_model_takes_a_step(build):
    workload = build()
    assert workload.job_class in WORKLOADS
    loss = workload.step()
    assert loss == loss and loss > 0  # finite, not NaN


def test_training_rate_calls_the_hooks_after_every_step():
    seen: list[StepInfo] = []
    rate = training_rate(synthetic_mlp(), budget_s=0.01, step_hooks=[seen.append])
    assert rate.job_class == "synthetic-mlp" and rate.batch == 96 and rate.samples_per_s > 0
    assert len(seen) == rate.steps + 2  # warm-up steps see the hooks too
    assert all(info.samples == 96 for info in seen)


def test_a_hook_that_slows_steps_slows_the_figure():
    import time

    slow = training_rate(synthetic_mlp(), budget_s=0.05, step_hooks=[lambda info: time.sleep(0.01)])
    assert slow.samples_per_s < 96 / 0.01


def test_the_suite_seeds_benchmark_entries_and_round_trips():
    result = run_suite(quick=True, micro=False, job_classes=["synthetic-mlp"])
    again = SuiteResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    (entry,) = benchmark_entries("tpu-v4", result)
    assert (entry.job_class, entry.flavor, entry.devices, entry.source) == (
        "synthetic-mlp",
        "tpu-v4",
        1,
        Source.BENCHMARK,
    )
    table = seed_table({"tpu-v4": result}, {"tpu-v4": 275.0})
    assert table.lookup("synthetic-mlp", "tpu-v4", 1) == entry
    with pytest.raises(ValueError, match="no benchmark"):
        run_suite(job_classes=["bert-huge"])


def test_the_cli_prints_json():
    from runtime.bench.__main__ import main

    assert main(["--quick", "--json", "--no-micro", "--class", "synthetic-mlp"]) == 0
