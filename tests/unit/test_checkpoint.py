"""Layered checkpoints on a local directory: schedule, snapshot, atomic commit, verification, retention."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from runtime.jobspec import CheckpointSpec
from runtime.recovery.checkpoint import (
    Checkpointer,
    CorruptCheckpoint,
    RestorePlan,
    SaveRecord,
    checkpoint_name,
    find_restore,
    kind_at,
    load,
    read_manifest,
    retain,
    step_of,
)
from runtime.recovery.store import LocalStore, StoreError, open_store


def make_model(seed: int = 0, width: int = 16) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, width), nn.ReLU(), nn.Linear(width, 4))


def make_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: int, seed: int = 1) -> None:
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(32, 8, generator=generator)
        y = torch.randn(32, 4, generator=generator)
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()


def trained(seed: int = 0, steps: int = 2) -> tuple[nn.Sequential, torch.optim.Optimizer]:
    """A model and an SGD optimizer after a few steps, so the momentum buffers exist."""
    model = make_model(seed)
    optimizer = make_optimizer(model)
    train(model, optimizer, steps, seed=seed + 1)
    return model, optimizer


def assert_same_tree(a: Any, b: Any) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    elif isinstance(a, Mapping):
        assert isinstance(b, Mapping) and set(a) == set(b)
        for key in a:
            assert_same_tree(a[key], b[key])
    elif isinstance(a, list | tuple):
        assert isinstance(b, list | tuple) and len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            assert_same_tree(x, y)
    else:
        assert a == b


def spec(weights_every: int = 1, optimizer_every: int = 2, keep: int = 100) -> CheckpointSpec:
    return CheckpointSpec(weights_every=weights_every, optimizer_every=optimizer_every, keep=keep)


def save_sync(store: LocalStore, step: int, kind: str, model: nn.Module, optimizer: Any, keep: int = 100) -> None:
    Checkpointer(store, spec(keep=keep), background=False).save(step, kind, model, optimizer, {"step": step})


def flip_byte(path: Path, offset: int = -20) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


# --- names and schedule ----------------------------------------------------------------------------


def test_names_are_zero_padded_and_parse_back():
    assert checkpoint_name(250) == "step-0000000250"
    assert step_of("step-0000000250") == 250
    assert step_of("step-250") is None
    assert step_of(".partial-step-0000000250-1-ab") is None
    assert sorted(checkpoint_name(s) for s in (100, 9, 25)) == [checkpoint_name(s) for s in (9, 25, 100)]
    for bad in (-1, 10**10, 1.5, True):
        with pytest.raises(ValueError, match="step"):
            checkpoint_name(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("step", "kind"),
    [
        (-5, None),
        (0, None),
        (1, None),
        (4, None),
        (5, "weights"),
        (10, "weights"),
        (15, "full"),
        (20, "weights"),
        (30, "full"),
        (31, None),
        (45, "full"),
    ],
)
def test_kind_at(step: int, kind: str | None):
    assert kind_at(spec(weights_every=5, optimizer_every=15), step) == kind


def test_every_step_full_when_both_intervals_are_one():
    assert [kind_at(spec(1, 1), s) for s in (1, 2, 3)] == ["full", "full", "full"]


@pytest.mark.parametrize("background", [True, False])
def test_layered_schedule_over_a_run(tmp_path: Path, background: bool):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    seen: list[SaveRecord] = []
    with Checkpointer(store, spec(2, 6), background=background, on_saved=seen.append) as checkpointer:
        returned = [checkpointer.maybe_save(step, model, optimizer, {"step": step}) for step in range(1, 13)]
    saved = [(r.step, r.kind) for r in returned if r is not None]
    expected = [(2, "weights"), (4, "weights"), (6, "full"), (8, "weights"), (10, "weights"), (12, "full")]
    assert saved == expected
    assert [(r.step, r.kind) for r in checkpointer.records] == expected
    assert seen == checkpointer.records
    assert store.names() == [checkpoint_name(s) for s, _ in expected]
    for step, kind in expected:
        manifest = read_manifest(store, checkpoint_name(step))
        assert (manifest.step, manifest.kind, manifest.meta) == (step, kind, {"step": step})
        files = {"weights.pt", "optimizer.pt"} if kind == "full" else {"weights.pt"}
        assert set(manifest.files) == files
        assert {p.name for p in (tmp_path / checkpoint_name(step)).iterdir()} == files | {"manifest.json"}


def test_a_full_step_without_an_optimizer_saves_the_weights(tmp_path: Path):
    store = LocalStore(tmp_path)
    with Checkpointer(store, spec(1, 2), background=False) as checkpointer:
        record = checkpointer.maybe_save(2, make_model(), None, {})
    assert record is not None and record.kind == "weights"
    with pytest.raises(ValueError, match="optimizer"):
        Checkpointer(store, spec()).save(4, "full", make_model(), None, {})


def test_the_manifest_has_the_documented_shape(tmp_path: Path):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    save_sync(store, 7, "full", model, optimizer)
    manifest = json.loads((tmp_path / checkpoint_name(7) / "manifest.json").read_bytes())
    assert set(manifest) == {"format", "step", "kind", "created_at", "files", "meta"}
    assert (manifest["format"], manifest["step"], manifest["kind"], manifest["meta"]) == (1, 7, "full", {"step": 7})
    assert isinstance(manifest["created_at"], float)
    for file in ("weights.pt", "optimizer.pt"):
        entry = manifest["files"][file]
        assert entry["bytes"] == (tmp_path / checkpoint_name(7) / file).stat().st_size
        assert len(entry["sha256"]) == 64


def test_meta_that_json_cannot_hold_fails_in_the_callers_thread(tmp_path: Path):
    with pytest.raises(ValueError, match="JSON"):
        Checkpointer(LocalStore(tmp_path), spec()).save(1, "weights", make_model(), None, {"x": object()})


# --- round trip ------------------------------------------------------------------------------------


@pytest.mark.parametrize("background", [True, False])
def test_a_full_checkpoint_restores_identical_tensors_and_training_continues_identically(
    tmp_path: Path, background: bool
):
    store = LocalStore(tmp_path)
    model, optimizer = trained(steps=3)
    assert all("momentum_buffer" in state for state in optimizer.state_dict()["state"].values())
    with Checkpointer(store, spec(), background=background) as checkpointer:
        checkpointer.save(3, "full", model, optimizer, {"data_position": 96})
    assert checkpointer.last_error is None

    plan = find_restore(store)
    assert plan is not None
    assert (plan.mode, plan.weights_step, plan.optimizer_step, plan.meta, plan.skipped) == (
        "newest_weights",
        3,
        3,
        {"data_position": 96},
        (),
    )
    restored = load(store, plan)
    assert_same_tree(model.state_dict(), restored.model_state)
    assert_same_tree(optimizer.state_dict(), restored.optimizer_state)

    fresh = make_model(seed=99)
    fresh_optimizer = make_optimizer(fresh)
    fresh.load_state_dict(restored.model_state)
    assert restored.optimizer_state is not None
    fresh_optimizer.load_state_dict(restored.optimizer_state)
    train(model, optimizer, 2, seed=7)
    train(fresh, fresh_optimizer, 2, seed=7)
    assert_same_tree(model.state_dict(), fresh.state_dict())


def test_another_rank_loads_from_a_plan_built_from_the_broadcast_steps(tmp_path: Path):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    save_sync(store, 4, "full", model, optimizer)
    save_sync(store, 5, "weights", model, None)
    restored = load(store, RestorePlan("newest_weights", 5, 4, {}))
    assert_same_tree(model.state_dict(), restored.model_state)
    assert_same_tree(optimizer.state_dict(), restored.optimizer_state)


def test_background_and_sync_saves_write_identical_files(tmp_path: Path):
    model, optimizer = trained()
    stores = {}
    for background in (True, False):
        stores[background] = LocalStore(tmp_path / str(background))
        with Checkpointer(stores[background], spec(), background=background) as checkpointer:
            checkpointer.save(2, "full", model, optimizer, {"k": 1})
    name = checkpoint_name(2)
    for file in ("weights.pt", "optimizer.pt"):
        assert stores[True].read(name, file) == stores[False].read(name, file)
    manifests = [read_manifest(stores[b], name) for b in (True, False)]
    assert manifests[0].files == manifests[1].files and manifests[0].meta == manifests[1].meta


def test_save_records_are_consistent(tmp_path: Path):
    model, optimizer = trained(seed=3)
    big = make_model(width=4096)  # about 0.8 MB of weights: a write measurably longer than nothing
    background_store, sync_store = LocalStore(tmp_path / "bg"), LocalStore(tmp_path / "sync")
    threads: list[str] = []
    completed: list[SaveRecord] = []

    def on_saved(record: SaveRecord) -> None:
        threads.append(threading.current_thread().name)
        completed.append(record)

    with Checkpointer(background_store, spec(), on_saved=on_saved) as checkpointer:
        pending = checkpointer.save(2, "full", big, make_optimizer(big), {})
        assert (pending.step, pending.kind, pending.background) == (2, "full", True)
        assert (pending.write_s, pending.bytes, pending.deleted) == (0.0, 0, ())
        assert pending.stall_s > 0
        checkpointer.wait()
        assert checkpointer.records == completed
        done = completed[0]
        assert (done.step, done.kind, done.stall_s, done.background) == (2, "full", pending.stall_s, True)
        assert done.write_s > 0
        manifest = read_manifest(background_store, checkpoint_name(2))
        assert done.bytes == sum(entry.bytes for entry in manifest.files.values())
        assert threads == ["polychip-checkpoint"]
        assert done.to_json()["deleted"] == []

    with Checkpointer(sync_store, spec(), background=False) as checkpointer:
        record = checkpointer.save(2, "weights", model, optimizer, {})
    assert record.background is False
    assert record.stall_s >= record.write_s > 0  # a synchronous save holds the thread for its whole write
    assert checkpointer.records == [record]


class BlockingStore(LocalStore):
    """A LocalStore whose commits wait for ``release``: a save that stays in flight as long as a test needs."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = threading.Event()
        self.entered = threading.Event()

    def commit(self, name: str, files: Mapping[str, bytes], manifest: bytes) -> None:
        self.entered.set()
        assert self.release.wait(timeout=30)
        super().commit(name, files, manifest)


def test_the_snapshot_is_taken_before_save_returns(tmp_path: Path):
    store = BlockingStore(tmp_path)
    model, optimizer = trained()
    expected_model = {k: v.clone() for k, v in model.state_dict().items()}
    expected_momentum = [s["momentum_buffer"].clone() for s in optimizer.state_dict()["state"].values()]
    checkpointer = Checkpointer(store, spec())
    checkpointer.save(2, "full", model, optimizer, {})
    assert store.entered.wait(timeout=30)
    train(model, optimizer, 3, seed=5)  # in place, while the save is still in flight
    store.release.set()
    checkpointer.close()
    plan = find_restore(store)
    assert plan is not None
    restored = load(store, plan)
    assert_same_tree(expected_model, restored.model_state)
    assert restored.optimizer_state is not None
    assert_same_tree(expected_momentum, [s["momentum_buffer"] for s in restored.optimizer_state["state"].values()])


class SteppedPerfCounter:
    """The checkpoint module's ``time`` for a test: ``perf_counter`` moves only when the test moves it,
    and says when a given thread first read it. A stall is then measured on the test's own steps, not
    on how soon a busy machine schedules a thread."""

    def __init__(self, watch: str) -> None:
        self.now = 100.0
        self.watch = watch
        self.read_by_watched = threading.Event()

    def perf_counter(self) -> float:
        if threading.current_thread().name == self.watch:
            self.read_by_watched.set()
        return self.now

    def time(self) -> float:
        return time.time()


def test_a_save_waits_for_the_one_in_flight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import runtime.recovery.checkpoint as checkpoint_module

    clock = SteppedPerfCounter(watch="second-save")
    monkeypatch.setattr(checkpoint_module, "time", clock)
    store = BlockingStore(tmp_path)
    model, optimizer = trained()
    checkpointer = Checkpointer(store, spec())
    checkpointer.save(1, "weights", model, optimizer, {})
    assert store.entered.wait(timeout=30)
    second = threading.Thread(target=checkpointer.save, args=(2, "full", model, optimizer, {}), name="second-save")
    second.start()
    assert clock.read_by_watched.wait(timeout=30)  # the second save has started its stall clock
    second.join(timeout=0.3)
    assert second.is_alive()  # held: the first save is still being written
    clock.now += 0.3  # the 0.3 s it was held, on the stall's own clock
    store.release.set()
    second.join(timeout=30)
    assert not second.is_alive()
    checkpointer.close()
    assert [r.step for r in checkpointer.records] == [1, 2]
    assert checkpointer.records[1].stall_s >= 0.2  # it waited at least most of the 0.3 s above
    checkpointer.close()  # idempotent
    with pytest.raises(RuntimeError, match="closed"):
        checkpointer.save(3, "weights", model, None, {})


# --- failures while saving -------------------------------------------------------------------------


class FailingStore(LocalStore):
    """Fails the first ``failures`` commits, as a full disk or a dropped connection would."""

    def __init__(self, root: Path, failures: int) -> None:
        super().__init__(root)
        self.failures = failures

    def commit(self, name: str, files: Mapping[str, bytes], manifest: bytes) -> None:
        if self.failures:
            self.failures -= 1
            raise StoreError("disk full")
        super().commit(name, files, manifest)


def test_a_failed_background_save_is_kept_and_logged_and_training_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    store = FailingStore(tmp_path, failures=1)
    model, optimizer = trained()
    with Checkpointer(store, spec()) as checkpointer:
        record = checkpointer.maybe_save(2, model, optimizer, {})
        assert record is not None
        checkpointer.wait()
        assert isinstance(checkpointer.last_error, StoreError)
        assert checkpointer.records == []
        assert checkpointer.maybe_save(3, model, optimizer, {}) is not None  # the next save tries again
    assert [r.step for r in checkpointer.records] == [3]
    assert store.names() == [checkpoint_name(3)]
    err = capsys.readouterr().err
    assert "save of step 2" in err and "disk full" in err


def test_a_failed_sync_save_raises(tmp_path: Path):
    with pytest.raises(StoreError, match="disk full"):
        Checkpointer(FailingStore(tmp_path, failures=1), spec(), background=False).save(
            1, "weights", make_model(), None
        )


def test_an_on_saved_that_raises_does_not_stop_the_saver(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    def on_saved(record: SaveRecord) -> None:
        raise KeyError("telemetry down")

    with Checkpointer(LocalStore(tmp_path), spec(), on_saved=on_saved) as checkpointer:
        checkpointer.save(1, "weights", make_model(), None)
        checkpointer.save(2, "weights", make_model(), None)
    assert [r.step for r in checkpointer.records] == [1, 2]
    assert isinstance(checkpointer.last_error, KeyError)
    assert "telemetry down" in capsys.readouterr().err


# --- torn and corrupt checkpoints ------------------------------------------------------------------


def test_a_corrupt_newest_checkpoint_is_skipped_with_a_reason(tmp_path: Path):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    older = {k: v.clone() for k, v in model.state_dict().items()}
    save_sync(store, 2, "full", model, optimizer)
    train(model, optimizer, 2)
    save_sync(store, 4, "full", model, optimizer)
    flip_byte(tmp_path / checkpoint_name(4) / "weights.pt")

    plan = find_restore(store)
    assert plan is not None
    assert (plan.weights_step, plan.optimizer_step) == (2, 2)
    assert len(plan.skipped) == 1
    name, reason = plan.skipped[0]
    assert name == checkpoint_name(4) and "weights.pt fails its sha256 check" in reason
    assert "skipped 1 newer invalid checkpoint" in plan.note
    assert_same_tree(older, load(store, plan).model_state)


def test_load_verifies_again(tmp_path: Path):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    save_sync(store, 2, "full", model, optimizer)
    plan = find_restore(store)
    assert plan is not None
    flip_byte(tmp_path / checkpoint_name(2) / "optimizer.pt")
    with pytest.raises(CorruptCheckpoint, match=r"optimizer\.pt fails its sha256 check"):
        load(store, plan)


def _rewrite_manifest(directory: Path, change: Any) -> None:
    path = directory / "manifest.json"
    manifest = json.loads(path.read_bytes())
    change(manifest)
    path.write_text(json.dumps(manifest))


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda d: _rewrite_manifest(d, lambda m: m["files"]["weights.pt"].update(sha256="0" * 64)), "sha256 check"),
        (lambda d: _rewrite_manifest(d, lambda m: m["files"]["weights.pt"].update(bytes=1)), "the manifest says 1"),
        (lambda d: _rewrite_manifest(d, lambda m: m.update(format=2)), "format 2"),
        (lambda d: _rewrite_manifest(d, lambda m: m.update(step=3)), "does not match the name"),
        (lambda d: _rewrite_manifest(d, lambda m: m.update(kind="half")), "neither weights nor full"),
        (lambda d: _rewrite_manifest(d, lambda m: m["files"].pop("optimizer.pt")), "must list optimizer.pt"),
        (lambda d: (d / "manifest.json").write_bytes(b'{"format": 1, "st'), "not JSON"),
        (lambda d: (d / "manifest.json").write_bytes(b"[1, 2]"), "not a JSON object"),
        (lambda d: (d / "optimizer.pt").unlink(), "optimizer.pt is missing"),
        (lambda d: (d / "weights.pt").write_bytes(b"short"), "has 5 bytes"),
    ],
    ids=["sha", "size", "format", "step", "kind", "files", "json", "not-object", "missing", "truncated"],
)
def test_an_untrustworthy_newest_checkpoint_is_skipped(tmp_path: Path, damage: Any, reason: str):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    save_sync(store, 2, "full", model, optimizer)
    save_sync(store, 4, "full", model, optimizer)
    damage(tmp_path / checkpoint_name(4))
    plan = find_restore(store)
    assert plan is not None and (plan.weights_step, plan.optimizer_step) == (2, 2)
    assert [name for name, _ in plan.skipped] == [checkpoint_name(4)]
    assert reason in plan.skipped[0][1]


def test_nothing_valid_means_no_plan(tmp_path: Path):
    store = LocalStore(tmp_path)
    assert find_restore(store) is None
    assert find_restore(LocalStore(tmp_path / "never-created")) is None
    save_sync(store, 2, "weights", make_model(), None)
    flip_byte(tmp_path / checkpoint_name(2) / "weights.pt")
    assert find_restore(store) is None
    assert find_restore(store, "last_full") is None
    with pytest.raises(ValueError, match="newest_weights, last_full"):
        find_restore(store, "newest")


def test_a_torn_commit_is_never_listed_and_clean_partial_removes_it(tmp_path: Path):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    save_sync(store, 2, "full", model, optimizer)
    # A commit that died before its rename, one whose directory lost its manifest, one mid-delete.
    partial = tmp_path / f".partial-{checkpoint_name(6)}-4242-deadbeef"
    partial.mkdir()
    (partial / "weights.pt").write_bytes(b"half")
    no_manifest = tmp_path / checkpoint_name(4)
    no_manifest.mkdir()
    (no_manifest / "weights.pt").write_bytes(b"whole, but never committed")
    deleting = tmp_path / f".deleting-{checkpoint_name(1)}-4242-deadbeef"
    deleting.mkdir()
    (tmp_path / "lost+found").mkdir()  # the root of a dedicated volume

    assert store.names() == [checkpoint_name(2)]
    plan = find_restore(store)
    assert plan is not None and plan.weights_step == 2 and plan.skipped == ()
    assert store.clean_partial() == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lost+found", checkpoint_name(2)]
    assert store.clean_partial() == 0


def test_a_replace_that_died_between_its_renames_gets_its_old_version_back(tmp_path: Path):
    store = LocalStore(tmp_path)
    save_sync(store, 2, "weights", make_model(), None)
    stepped_aside = tmp_path / f".replaced-{checkpoint_name(2)}-4242-deadbeef"
    (tmp_path / checkpoint_name(2)).rename(stepped_aside)
    assert store.names() == []
    assert store.clean_partial() == 0  # put back, not removed
    assert store.names() == [checkpoint_name(2)]
    assert find_restore(store) is not None


def test_committing_an_existing_name_replaces_it_whole(tmp_path: Path):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    save_sync(store, 2, "full", model, optimizer)
    train(model, optimizer, 1)
    save_sync(store, 2, "weights", model, None)  # a retry of step 2 after a restart
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(2)]
    assert sorted(p.name for p in (tmp_path / checkpoint_name(2)).iterdir()) == ["manifest.json", "weights.pt"]
    plan = find_restore(store)
    assert plan is not None and plan.optimizer_step is None
    assert_same_tree(model.state_dict(), load(store, plan).model_state)


def test_local_store_basics(tmp_path: Path):
    store = LocalStore(tmp_path / "a" / "b")
    assert store.names() == [] and store.clean_partial() == 0
    store.commit("x1", {"f.bin": b"abc"}, b"{}")
    assert store.read("x1", "f.bin") == b"abc"
    assert store.read("x1", "manifest.json") == b"{}"
    with pytest.raises(StoreError, match=r"cannot read nope of x1"):
        store.read("x1", "nope")
    store.delete("x1")
    store.delete("x1")
    assert store.names() == [] and list((tmp_path / "a" / "b").iterdir()) == []
    for bad in ("", "../up", "a/b", ".hidden", "-x"):
        with pytest.raises(ValueError, match="checkpoint name"):
            store.commit(bad, {}, b"{}")
    with pytest.raises(ValueError, match="commit marker"):
        store.commit("x2", {"manifest.json": b"{}"}, b"{}")


# --- retention -------------------------------------------------------------------------------------


def test_retention_keeps_the_newest_and_the_newest_full(tmp_path: Path):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    deleted: list[str] = []
    with Checkpointer(store, spec(1, 4, keep=2), background=False) as checkpointer:
        for step in range(1, 11):
            record = checkpointer.maybe_save(step, model, optimizer, {})
            assert record is not None
            deleted.extend(record.deleted)
    # Newest two: 9, 10; newest two full: 4, 8.
    assert store.names() == [checkpoint_name(s) for s in (4, 8, 9, 10)]
    assert sorted(deleted) == [checkpoint_name(s) for s in (1, 2, 3, 5, 6, 7)]
    assert retain(store, 2) == []
    assert retain(store, 1) == [checkpoint_name(s) for s in (4, 9)]
    with pytest.raises(ValueError, match="keep"):
        retain(store, 0)


def test_retention_and_unparseable_manifests(tmp_path: Path):
    store = LocalStore(tmp_path)
    for step in (1, 2, 3, 4, 5):
        save_sync(store, step, "full", make_model(), make_optimizer(make_model()))
    for step in (1, 5):
        (tmp_path / checkpoint_name(step) / "manifest.json").write_bytes(b"garbage")
    (tmp_path / "not-a-checkpoint").mkdir()
    (tmp_path / "not-a-checkpoint" / "manifest.json").write_bytes(b"{}")
    # Kept: 3 and 4 (the newest parseable ones). 5 is newer than them: left for a restore to skip.
    # 1 is older than everything kept: deleted. Names that are not checkpoints are not ours.
    assert retain(store, 2) == [checkpoint_name(1), checkpoint_name(2)]
    assert store.names() == ["not-a-checkpoint"] + [checkpoint_name(s) for s in (3, 4, 5)]
    plan = find_restore(store)
    assert plan is not None and plan.weights_step == 4 and plan.skipped[0][0] == checkpoint_name(5)


def test_retention_never_deletes_when_nothing_parses(tmp_path: Path):
    store = LocalStore(tmp_path)
    save_sync(store, 1, "weights", make_model(), None)
    (tmp_path / checkpoint_name(1) / "manifest.json").write_bytes(b"garbage")
    assert retain(store, 1) == []
    assert store.names() == [checkpoint_name(1)]


# --- restore modes ---------------------------------------------------------------------------------


def test_newest_weights_and_last_full_when_the_weights_are_newer(tmp_path: Path):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    states = {}
    for step, kind in ((4, "full"), (5, "weights"), (6, "weights")):
        train(model, optimizer, 1, seed=step)
        save_sync(store, step, kind, model, optimizer if kind == "full" else None)
        states[step] = {k: v.clone() for k, v in model.state_dict().items()}
    momentum_at_4 = read_manifest(store, checkpoint_name(4)).files["optimizer.pt"]

    newest = find_restore(store, "newest_weights")
    assert newest is not None
    assert (newest.weights_step, newest.optimizer_step, newest.meta) == (6, 4, {"step": 6})
    assert "2 steps older" in newest.note
    restored = load(store, newest)
    assert_same_tree(states[6], restored.model_state)
    assert restored.optimizer_state is not None

    last_full = find_restore(store, "last_full")
    assert last_full is not None
    assert (last_full.mode, last_full.weights_step, last_full.optimizer_step, last_full.meta) == (
        "last_full",
        4,
        4,
        {"step": 4},
    )
    restored = load(store, last_full)
    assert_same_tree(states[4], restored.model_state)
    assert momentum_at_4.bytes > 0


def test_without_any_full_checkpoint_the_optimizer_starts_fresh(tmp_path: Path):
    store = LocalStore(tmp_path)
    save_sync(store, 3, "weights", make_model(), None)
    for mode in ("newest_weights", "last_full"):
        plan = find_restore(store, mode)
        assert plan is not None and (plan.weights_step, plan.optimizer_step) == (3, None)
        assert "optimizer starts fresh" in plan.note
        assert load(store, plan).optimizer_state is None


def test_newest_weights_takes_the_full_state_at_or_before_the_weights(tmp_path: Path):
    store = LocalStore(tmp_path)
    model, optimizer = trained()
    save_sync(store, 2, "full", model, optimizer)
    save_sync(store, 3, "weights", model, None)
    save_sync(store, 4, "full", model, optimizer)
    flip_byte(tmp_path / checkpoint_name(4) / "optimizer.pt")
    plan = find_restore(store)
    assert plan is not None and (plan.weights_step, plan.optimizer_step) == (3, 2)
    assert [name for name, _ in plan.skipped] == [checkpoint_name(4)]
    plan = find_restore(store, "last_full")
    assert plan is not None and (plan.weights_step, plan.optimizer_step) == (2, 2)


def test_open_store_gives_a_local_store_for_paths_and_file_urls(tmp_path: Path):
    for url in (str(tmp_path), f"file://{tmp_path}", f"file://localhost{tmp_path}"):
        store = open_store(url)
        assert isinstance(store, LocalStore) and store.location == str(tmp_path)
    for url, hint in [
        ("", "empty"),
        ("  ", "empty"),
        ("file://otherhost/x", "host must be empty"),
        ("file:relative/x", "two slashes"),
        ("file:///x?y=1", "no query"),
        ("gs://bucket/x", "unsupported scheme 'gs'"),
    ]:
        with pytest.raises(ValueError, match=hint):
            open_store(url)
