import pytest

from runtime.jobspec import BalancingSpec, CheckpointSpec, JobSpec, SpecError, WorkloadSpec, parse_job_spec

VALID = {"name": "mlp", "devices": 2, "flavors": ["h100-sxm", "a100-sxm"]}


def test_a_minimal_spec_gets_the_defaults():
    spec = parse_job_spec(VALID, known_flavors={"h100-sxm", "a100-sxm"})
    assert spec == JobSpec(name="mlp", devices=2, flavors=("h100-sxm", "a100-sxm"), workload=WorkloadSpec())
    assert parse_job_spec(spec.to_dict()) == spec


def test_balancing_defaults_to_dynamic_and_takes_each_mode():
    assert parse_job_spec(VALID).balancing == BalancingSpec(mode="dynamic")
    for mode in ("dynamic", "static", "equal"):
        spec = parse_job_spec({**VALID, "balancing": {"mode": mode}})
        assert spec.balancing.mode == mode
        assert spec.to_dict()["balancing"] == {"mode": mode}
        assert parse_job_spec(spec.to_dict()) == spec


def test_duplicate_flavors_collapse_in_order():
    assert parse_job_spec({**VALID, "flavors": ["b", "a", "b"]}).flavors == ("b", "a")


@pytest.mark.parametrize(
    ("change", "field", "hint"),
    [
        ({"name": " "}, "name", "required"),
        ({"devices": 0}, "devices", "between 1 and 64"),
        ({"devices": True}, "devices", "whole number"),
        ({"devices": 65}, "devices", "between 1 and 64"),
        ({"flavors": "h100-sxm"}, "flavors", "non-empty list"),
        ({"flavors": ["h100-sxm", "tpu-v9"]}, "flavors[1]", "choose from a100-sxm, h100-sxm"),
        ({"workload": {"kind": "gpt-5"}}, "workload.kind", "synthetic-mlp"),
        ({"workload": {"lr": 0}}, "workload.lr", "greater than 0"),
        ({"workload": {"steps": 1.5}}, "workload.steps", "whole number"),
        ({"workload": {"batch": 3}}, "workload.batch", "allowed here"),
        ({"workload": {"global_batch": 1}}, "workload.global_batch", "at least devices"),
        ({"workload": []}, "workload", "object"),
        ({"tenant": 9}, "tenant", "unknown field"),
        ({"priority": 5000}, "priority", "between -1000 and 1000"),
        ({"priority": "high"}, "priority", "whole number"),
        ({"balancing": "dynamic"}, "balancing", "object"),
        ({"balancing": {"mode": "fastest"}}, "balancing.mode", "dynamic"),
        ({"balancing": {"mode": "static", "threshold": 0.1}}, "balancing.threshold", "allowed here: mode"),
        ({"checkpoint": 50}, "checkpoint", "object"),
        ({"checkpoint": {"weights_every": 0}}, "checkpoint.weights_every", "between 1 and"),
        ({"checkpoint": {"weights_every": 40, "optimizer_every": 100}}, "checkpoint.optimizer_every", "multiple"),
        ({"checkpoint": {"keep": 0}}, "checkpoint.keep", "between 1 and 1000"),
        ({"checkpoint": {"restore": "oldest"}}, "checkpoint.restore", "last_full"),
        ({"checkpoint": {"every": 5}}, "checkpoint.every", "allowed here"),
        ({"min_devices": 3}, "min_devices", "between 1 and 2"),
        ({"min_devices": 0}, "min_devices", "between 1 and 2"),
        ({"max_restarts": -1}, "max_restarts", "between 0 and 100"),
    ],
)
def test_each_mistake_names_its_field_and_the_fix(change, field, hint):
    with pytest.raises(SpecError) as caught:
        parse_job_spec({**VALID, **change}, known_flavors={"h100-sxm", "a100-sxm"})
    assert caught.value.field == field
    assert hint in caught.value.message


def test_a_spec_that_is_not_an_object_is_refused():
    with pytest.raises(SpecError) as caught:
        parse_job_spec(["name"])
    assert caught.value.field == "spec"


def test_checkpoints_default_to_full_saves_restored_whole_and_three_restarts_on_the_full_size():
    spec = parse_job_spec(VALID)
    # Issue 17, item 18: by default every save holds the optimizer state, and a restore gives one step's.
    assert spec.checkpoint == CheckpointSpec(weights_every=50, optimizer_every=50, keep=3, restore="last_full")
    assert (spec.min_devices, spec.max_restarts) == (None, 3)
    custom = parse_job_spec(
        {
            **VALID,
            "checkpoint": {"weights_every": 100, "optimizer_every": 500, "keep": 5, "restore": "last_full"},
            "min_devices": 1,
            "max_restarts": 0,
        }
    )
    assert custom.checkpoint == CheckpointSpec(100, 500, 5, "last_full")
    assert (custom.min_devices, custom.max_restarts) == (1, 0)
    # Only weights_every given: the optimizer state goes with every save.
    assert parse_job_spec({**VALID, "checkpoint": {"weights_every": 20}}).checkpoint.optimizer_every == 20
    assert parse_job_spec(custom.to_dict()) == custom


BUNDLE = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("workload", "field", "hint"),
    [
        ({"kind": "resnet50"}, "workload.kind", "builtin"),
        ({"model": "gpt-5"}, "workload.model", "charlm"),
        ({"kind": "synthetic-mlp", "model": "charlm"}, "workload.model", "leave model out"),
        ({"kind": "builtin", "image": "x"}, "workload.image", "not used by kind builtin"),
        ({"kind": "python"}, "workload.bundle", "POST /api/v1/bundles"),
        ({"kind": "python", "bundle": "sha256:abc", "entrypoint": "train.py"}, "workload.bundle", "64 hex"),
        ({"kind": "python", "bundle": BUNDLE}, "workload.entrypoint", "mypackage.train:main"),
        ({"kind": "python", "bundle": BUNDLE, "entrypoint": "/etc/train.py"}, "workload.entrypoint", "inside"),
        ({"kind": "python", "bundle": BUNDLE, "entrypoint": "../x.py"}, "workload.entrypoint", "inside"),
        ({"kind": "torchrun", "bundle": BUNDLE, "entrypoint": "pkg.mod:main"}, "workload.entrypoint", "train.py"),
        ({"kind": "python", "bundle": BUNDLE, "entrypoint": "t.py", "hidden": 3}, "workload.hidden", "not used"),
        ({"kind": "python", "bundle": BUNDLE, "entrypoint": "t.py", "args": "--x"}, "workload.args", "list"),
        (
            {"kind": "python", "bundle": BUNDLE, "entrypoint": "t.py", "env": {"RANK": "1"}},
            "workload.env.RANK",
            "set by",
        ),
        (
            {"kind": "python", "bundle": BUNDLE, "entrypoint": "t.py", "env": {"POLYCHIP_X": "1"}},
            "workload.env.POLYCHIP_X",
            "set by",
        ),
        ({"kind": "python", "bundle": BUNDLE, "entrypoint": "t.py", "env": {"1A": "1"}}, "workload.env.1A", "letters"),
        ({"kind": "python", "bundle": BUNDLE, "entrypoint": "t.py", "env": {"A": 1}}, "workload.env.A", "string"),
        ({"kind": "container"}, "workload.image", "ghcr.io"),
        ({"kind": "container", "image": "Bad Image"}, "workload.image", "image reference"),
        (
            {"kind": "container", "image": "ghcr.io/a/b:1", "bundle": BUNDLE},
            "workload.bundle",
            "not used by kind container",
        ),
    ],
)
def test_each_workload_kind_names_what_is_wrong(workload, field, hint):
    with pytest.raises(SpecError) as caught:
        parse_job_spec({**VALID, "workload": workload})
    assert caught.value.field == field
    assert hint in caught.value.message


@pytest.mark.parametrize(
    "workload",
    [
        {"kind": "builtin", "model": "charlm"},
        {"kind": "builtin", "model": "digits-cnn", "steps": 50},
        {"kind": "python", "bundle": BUNDLE, "entrypoint": "src/train.py", "args": ["--x", "1"], "env": {"A": "b"}},
        {"kind": "python", "bundle": BUNDLE, "entrypoint": "pkg.train:main"},
        {"kind": "torchrun", "bundle": BUNDLE, "entrypoint": "train.py"},
        {"kind": "container", "image": "ghcr.io/acme/train:1.2", "command": ["python", "-m", "train"]},
    ],
)
def test_every_kind_round_trips_through_storage(workload):
    spec = parse_job_spec({**VALID, "workload": workload})
    assert parse_job_spec(spec.to_dict()) == spec
    from runtime.jobspec import stored_job_spec

    assert stored_job_spec(spec.to_dict()) == spec


def test_a_builtin_model_gets_its_own_defaults_and_a_legacy_spec_reads_as_builtin():
    charlm = parse_job_spec({**VALID, "workload": {"model": "charlm"}}).workload
    assert (charlm.kind, charlm.steps, charlm.lr) == ("builtin", 150, 0.003)
    legacy = parse_job_spec({**VALID, "workload": {"kind": "synthetic-mlp", "steps": 10}}).workload
    assert (legacy.kind, legacy.model, legacy.steps) == ("builtin", "synthetic-mlp", 10)
    assert legacy.job_class == "synthetic-mlp"
    user = parse_job_spec({**VALID, "workload": {"kind": "python", "bundle": BUNDLE, "entrypoint": "t.py"}}).workload
    assert user.job_class == "python:abababababab:t.py"
