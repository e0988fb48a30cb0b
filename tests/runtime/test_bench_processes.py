"""The benchmarks that start real processes: restart cost, balancing efficiency, per-flavor emulation."""

from __future__ import annotations

import pytest


@pytest.mark.runtime
def test_restart_cost_is_measured_in_a_fresh_process():
    from runtime.bench import measure_restart_cost

    m = measure_restart_cost("synthetic-mlp")
    assert m.seconds > 0 and m.detail["checkpoint_bytes"] > 0
    parts = m.detail["checkpoint_s"] + m.detail["process_s"]
    assert parts == pytest.approx(m.seconds, abs=0.01)
    assert {"import_s", "load_s", "first_step_s", "interpreter_s"} <= set(m.detail)


@pytest.mark.runtime
def test_balance_efficiency_of_two_unequal_ranks():
    from runtime.bench import measure_balance_efficiency

    m = measure_balance_efficiency((1.0, 0.5), steps=15)
    assert m.detail["micro_batches"] == [64, 32]
    # The gang cannot beat its parts by more than timing noise, and at these speeds loses little.
    assert 0.5 < m.efficiency < 1.1
    assert m.detail["gang_samples_per_s"] == pytest.approx(m.efficiency * m.detail["sum_solo_samples_per_s"], rel=0.01)


@pytest.mark.runtime
def test_flavors_are_benchmarked_with_their_emulation():
    from runtime.backends.local.bench import benchmark_flavors

    profiles = {"fast": {"relative_speed": 1.0}, "slow": {"relative_speed": 0.25}}
    results = benchmark_flavors(profiles, job_classes=["synthetic-mlp"])
    fast, slow = (results[f].rate("synthetic-mlp") for f in ("fast", "slow"))
    assert fast is not None and slow is not None
    # Padding dominates the synthetic MLP's tiny steps: the figures follow the relative speeds.
    assert fast.samples_per_s / slow.samples_per_s == pytest.approx(4.0, rel=0.25)
    assert results["slow"].settings["emulation"]["relative_speed"] == 0.25
    with pytest.raises(ValueError, match="no local profile"):
        benchmark_flavors(profiles, ["missing"])
