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
        ({"workload": {"model": {"name": "charlm"}}}, "workload.model", "not a built-in model"),
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
        ({"devices": {"min": 4, "max": 2}}, "devices.min", "between 1 and 2"),
        ({"devices": {"max": 8}}, "devices.min", "required"),
        ({"devices": {"min": 1, "max": 8, "step": 2}}, "devices.step", "allowed here: max, min"),
        ({"devices": {"min": 1, "max": 8}, "min_devices": 2}, "devices", "give the range once"),
        ({"batch_scaling": "cubic"}, "batch_scaling", "linear"),
        ({"batch_scaling": "linear"}, "batch_scaling", "devices {min, max}"),
        ({"elastic": "yes"}, "elastic", "true or false"),
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


# --- every problem at once, and the spec as JSON Schema ---------------------------------------------


def test_every_problem_of_a_spec_is_told_at_once_each_naming_its_field():
    from runtime.jobspec import SpecErrors

    with pytest.raises(SpecErrors) as caught:
        parse_job_spec(
            {
                "name": "",
                "prioirty": 3,
                "devices": 0,
                "flavors": ["h100-sxm"],
                "workload": {"steps": 0, "lr": -1},
                "comm": {"compression": "zip"},
                "checkpoint": {"weights_every": 10, "optimizer_every": 15},
            }
        )
    fields = [problem.field for problem in caught.value.errors]
    assert fields == [
        "prioirty",
        "name",
        "devices",
        "workload.steps",
        "workload.lr",
        "comm.compression",
        "checkpoint.optimizer_every",
    ]
    # The error itself is the first problem, so a reader of one problem reads a real one.
    assert (caught.value.field, caught.value.message) == (caught.value.errors[0].field, caught.value.errors[0].message)
    assert "and 6 more problems" in str(caught.value)


@pytest.mark.parametrize(
    ("change", "field", "suggestion"),
    [
        ({"prioirty": 1}, "prioirty", "did you mean 'priority'?"),
        ({"max_restart": 1}, "max_restart", "did you mean 'max_restarts'?"),
        ({"workload": {"modle": "charlm"}}, "workload.modle", "did you mean 'model'?"),
        ({"comm": {"compresion": "topk"}}, "comm.compresion", "did you mean 'compression'?"),
        ({"checkpoint": {"weights_evry": 5}}, "checkpoint.weights_evry", "did you mean 'weights_every'?"),
        ({"flavors": ["h100-sx"]}, "flavors[0]", "did you mean 'h100-sxm'?"),
    ],
)
def test_an_unknown_name_is_answered_with_the_known_one_it_most_looks_like(change, field, suggestion):
    with pytest.raises(SpecError) as caught:
        parse_job_spec({**VALID, **change}, known_flavors={"h100-sxm", "a100-sxm"})
    assert caught.value.field == field and suggestion in caught.value.message


def test_a_name_like_no_known_one_gets_no_suggestion():
    with pytest.raises(SpecError) as caught:
        parse_job_spec({**VALID, "zzzz": 1})
    assert "did you mean" not in caught.value.message and "allowed here: balancing" in caught.value.message


def _schema_validator():
    from jsonschema import Draft202012Validator

    from runtime.jobspec import job_spec_schema

    schema = job_spec_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def _at(path: str, value: object) -> dict:
    """A valid one-device spec with ``value`` at the dotted ``path``."""
    spec: dict = {"name": "s", "devices": 1, "flavors": ["h100-sxm"]}
    if path == "devices.min":
        spec["devices"] = {"min": value, "max": 64}  # the largest max: any min in range is at most it
    elif path == "devices.max":
        spec["devices"] = {"min": 1, "max": value}
    elif "." in path:
        section, key = path.split(".")
        spec[section] = {key: value}
        if path == "checkpoint.optimizer_every":
            spec[section]["weights_every"] = 1  # a multiple of it, whatever the value
    else:
        spec[path] = value
    if path == "batch_scaling":
        spec["devices"] = {"min": 1, "max": 2}  # scaling is for a job whose count can change
    return spec


def test_the_schema_and_the_parser_agree_on_every_bound_and_choice():
    from runtime.jobspec import BOUNDS, CHOICES

    validator = _schema_validator()
    for path, (lo, hi) in BOUNDS.items():
        whole = isinstance(hi, int)
        if path == "min_devices":
            continue  # at most devices: a cross-field rule the schema cannot say (devices is 1 here)
        accepted = [lo, hi] if whole else [hi, (lo + hi) / 2]
        refused = [lo - 1, hi + 1] if whole else [lo, hi * 1.01 + 1]
        for value in accepted:
            parse_job_spec(_at(path, value))
            assert validator.is_valid(_at(path, value)), (path, value)
        for value in refused:
            with pytest.raises(SpecError):
                parse_job_spec(_at(path, value))
            assert not validator.is_valid(_at(path, value)), (path, value)
    for path, choices in CHOICES.items():
        for value in choices:
            spec = _at(path, value)
            if path == "workload.kind" and value != "builtin":
                continue  # the other kinds need their bundle or image: checked below
            parse_job_spec(spec)
            assert validator.is_valid(spec), (path, value)
        assert not validator.is_valid(_at(path, "no-such-choice"))


@pytest.mark.parametrize(
    "workload",
    [
        {"kind": "builtin", "model": "charlm"},
        {"kind": "python", "bundle": BUNDLE, "entrypoint": "src/train.py", "args": ["--x", "1"], "env": {"A": "b"}},
        {"kind": "torchrun", "bundle": BUNDLE, "entrypoint": "train.py"},
        {"kind": "container", "image": "ghcr.io/acme/train:1.2", "command": ["python", "-m", "train"]},
    ],
)
def test_every_kind_the_parser_takes_the_schema_takes_and_a_field_of_another_kind_neither(workload):
    validator = _schema_validator()
    spec = {**VALID, "workload": workload}
    parse_job_spec(spec)
    assert validator.is_valid(spec), list(validator.iter_errors(spec))
    stray = {**workload, ("image" if workload["kind"] != "container" else "bundle"): "x"}
    with pytest.raises(SpecError):
        parse_job_spec({**VALID, "workload": stray})
    assert not validator.is_valid({**VALID, "workload": stray})
    assert not validator.is_valid({**VALID, "workload": workload, "prioirty": 1})


def test_a_device_range_makes_an_elastic_job():
    spec = parse_job_spec({**VALID, "devices": {"min": 2, "max": 8}, "workload": {"global_batch": 64}})
    assert (spec.devices, spec.min_devices, spec.elastic, spec.batch_scaling) == (8, 2, True, "fixed")
    assert parse_job_spec(spec.to_dict()) == spec  # stored as devices, min_devices and elastic
    spelled_out = {**VALID, "devices": 8, "min_devices": 2, "elastic": True, "workload": {"global_batch": 64}}
    assert parse_job_spec(spelled_out) == spec


@pytest.mark.parametrize(
    ("scaling", "count", "batch", "lr"),
    [
        ("fixed", 2, 256, 0.1),  # the balancer splits the same global batch over fewer devices
        ("linear", 2, 64, 0.025),  # a quarter of the devices: a quarter of the batch and of the rate
        ("sqrt", 2, 64, 0.05),  # a quarter of the batch, half the rate
        ("linear", 8, 256, 0.1),  # all it asked for: as written
        ("linear", 3, 96, 0.0375),
    ],
)
def test_the_global_batch_and_learning_rate_follow_the_count(scaling, count, batch, lr):
    raw = {**VALID, "devices": {"min": 1, "max": 8}, "batch_scaling": scaling}
    spec = parse_job_spec({**raw, "workload": {"global_batch": 256, "lr": 0.1}})
    workload = spec.workload_on(count)
    assert workload.global_batch == batch
    assert workload.lr == pytest.approx(lr)
    assert spec.workload_on(1).global_batch >= 1
