"""Power loss during a checkpoint commit (RELIABILITY #12), replayed ALICE-style against a model of the disk.

A process crash keeps the page cache; a power loss keeps only what was made durable. The test records
every file-system operation ``write_checkpoint`` makes (create, mkdir, rename, remove, fsync), with each
file's bytes as they were when it was fsynced. It then rebuilds the on-disk state a power loss could
leave after every prefix of those operations, under the model of a journaling file system with delayed
allocation (ext4 ``data=ordered`` is kinder than this; ``data=writeback`` and XFS are close):

- directory operations reach the disk in program order, and an fsync of anything commits every earlier
  one, so a crash keeps the operations before the last fsync plus any further prefix of them;
- a file's contents survive only if it was fsynced after it was written; otherwise it is empty.

In every such state, recovery (``discard_incomplete`` + ``newest_checkpoint``) must find a checkpoint
without skipping any damaged one (a committed name always means complete files), it must be the old or
the new one bit for bit, and once ``write_checkpoint`` has returned it must be the new one.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

import memtrain.prepare.pipeline
from memtrain.dataset import open_dataset
from memtrain.layout import CHECKPOINT_WEIGHTS, CHECKPOINTS_DIR, MANIFEST
from memtrain.prepare.options import PrepareOptions
from memtrain.train.records.checkpoint import discard_incomplete, newest_checkpoint, write_checkpoint

OLD, NEW = 1, 2


@dataclass
class DiskLog:
    """What the code asked of the file system, in order; paths are relative to the run directory.

    Files are known by an id (the index of the operation that created them), so that bytes fsynced
    under a temporary name are found again after renames.
    """

    root: Path
    # ("mkdir" or "remove", path), ("create", path, id), ("rename", a, b), ("fsync",)
    ops: list[tuple] = field(default_factory=list)
    synced: list[tuple[int, int, bytes]] = field(default_factory=list)  # (operations before it, file id, bytes)
    live: dict[str, int] = field(default_factory=dict)  # path -> id of the files created while recording

    def rel(self, path: str | os.PathLike) -> str:
        return os.path.relpath(os.path.abspath(path), self.root)

    def create(self, path: str | os.PathLike) -> None:
        self.live[self.rel(path)] = len(self.ops)
        self.ops.append(("create", self.rel(path), len(self.ops)))

    def rename(self, src: str | os.PathLike, dst: str | os.PathLike) -> None:
        a, b = self.rel(src), self.rel(dst)
        self.live = {(b + p[len(a):] if p == a or p.startswith(a + os.sep) else p): i for p, i in self.live.items()}
        self.ops.append(("rename", a, b))

    def fsync(self, fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if not os.path.isdir(path):
            if self.rel(path) not in self.live:  # created by a call not routed here (numpy's own open)
                self.create(path)
            self.synced.append((len(self.ops), self.live[self.rel(path)], Path(path).read_bytes()))
        self.ops.append(("fsync",))


def recording(monkeypatch: pytest.MonkeyPatch, log: DiskLog) -> None:
    """Route the checkpoint code's file-system calls through ``log`` (and then to the real calls)."""
    real_open, real_fsync, real_rename, real_replace = open, os.fsync, os.rename, os.replace
    real_mkdir, real_rmtree = os.mkdir, shutil.rmtree

    def opener(file, mode="r", *args, **kwargs):
        if any(flag in mode for flag in "wax") and not os.path.exists(file):
            log.create(file)
        return real_open(file, mode, *args, **kwargs)

    def fsync(fd: int) -> None:
        real_fsync(fd)
        log.fsync(fd)

    def moving(real):
        def move(src, dst, *args, **kwargs) -> None:
            real(src, dst, *args, **kwargs)
            log.rename(src, dst)
        return move

    def mkdir(path, *args, **kwargs) -> None:
        real_mkdir(path, *args, **kwargs)
        log.ops.append(("mkdir", log.rel(path)))

    def rmtree(path, *args, **kwargs) -> None:
        log.ops.append(("remove", log.rel(path)))
        real_rmtree(path, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name == "memtrain" or name.startswith("memtrain."):
            monkeypatch.setattr(module, "open", opener, raising=False)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", moving(real_rename))
    monkeypatch.setattr(os, "replace", moving(real_replace))
    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(shutil, "rmtree", rmtree)


def snapshot(root: Path) -> dict[str, bytes | None]:
    """Every directory (None) and file (its bytes) under ``root``, by relative path: the durable start."""
    tree: dict[str, bytes | None] = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs:
            tree[os.path.relpath(os.path.join(folder, name), root)] = None
        for name in files:
            path = os.path.join(folder, name)
            tree[os.path.relpath(path, root)] = Path(path).read_bytes()
    return tree


def subtree(tree: dict, top: str) -> list[str]:
    """``top`` and every path below it."""
    return [p for p in tree if p == top or p.startswith(top + os.sep)]


def crash_state(start: dict[str, bytes | None], log: DiskLog, done: int, kept: int) -> dict[str, bytes | None]:
    """The disk after a power loss: the directory changes of the first ``kept`` operations applied; each
    file created meanwhile holds its bytes as of its last fsync among the first ``done`` (else nothing)."""
    durable = {file: data for count, file, data in log.synced if count < done}  # later fsyncs win
    tree: dict[str, bytes | int | None] = dict(start)  # a path -> None (dir), bytes (old file) or a file id
    for op in log.ops[:kept]:
        if op[0] == "mkdir":
            tree[op[1]] = None
        elif op[0] == "create":
            tree[op[1]] = op[2]
        elif op[0] == "remove":
            for path in subtree(tree, op[1]):
                del tree[path]
        elif op[0] == "rename":
            src, dst = op[1], op[2]
            for path in subtree(tree, dst):
                del tree[path]
            for path in subtree(tree, src):
                tree[dst + path[len(src):]] = tree.pop(path)
    return {path: durable.get(value, b"") if isinstance(value, int) else value for path, value in tree.items()}


def materialize(tree: dict[str, bytes | None], root: Path) -> None:
    root.mkdir(parents=True)
    for path in sorted(tree):
        target = root / path
        if tree[path] is None:
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tree[path])


def allowed_prefixes(log: DiskLog, done: int) -> range:
    """How many of the first ``done`` operations may have reached the disk: all up to the last fsync, and more."""
    last_fsync = max((i + 1 for i, op in enumerate(log.ops[:done]) if op[0] == "fsync"), default=0)
    return range(last_fsync, done + 1)


def crash_states(start: dict[str, bytes | None], log: DiskLog, root: Path):
    """Every (operations done, operations on disk, materialized directory) a power loss could leave."""
    for done in range(len(log.ops) + 1):
        for kept in allowed_prefixes(log, done):
            where = root / f"{done}-{kept}"
            materialize(crash_state(start, log, done, kept), where)
            yield done, kept, where


def write_weights(path: Path, values: np.ndarray) -> Path:
    np.save(path, values)
    return path


@pytest.fixture
def commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, bytes | None], DiskLog, dict]:
    """A run with committed checkpoint OLD; NEW's commit (which prunes OLD: keep=1) recorded."""
    run = tmp_path / "run"
    run.mkdir()
    weights = {OLD: np.arange(300, dtype=np.float32), NEW: np.arange(300, dtype=np.float32) * -2}
    state = {OLD: np.full(300, 0.5, np.float32), NEW: np.full(300, 0.25, np.float32)}
    sources = {}
    for update in (OLD, NEW):
        sources[update] = (write_weights(tmp_path / f"w{update}.npy", weights[update]),
                           {"m": write_weights(tmp_path / f"m{update}.npy", state[update])})
    write_checkpoint(run, OLD, meta_of(OLD), sources[OLD][0], sources[OLD][1], keep=1)
    start = snapshot(run)
    log = DiskLog(run)
    with monkeypatch.context() as patch:
        recording(patch, log)
        write_checkpoint(run, NEW, meta_of(NEW), sources[NEW][0], sources[NEW][1], keep=1)
    return start, log, weights


def meta_of(update: int) -> dict:
    """The metadata fields a resume reads (a checkpoint without them is skipped as damaged)."""
    position = {"epoch": update, "batch": 0, "version": update, "epoch_loss": 0.0, "epoch_rows": 0, "skipped": 0,
                "best": None}
    return {"update": update, "position": position, "layout": {}, "data": {}, "model": {}, "optimizer": {}}


def test_the_recorded_commit_has_the_operations_the_model_needs(commit) -> None:
    _, log, _ = commit
    kinds = [op[0] for op in log.ops]
    for kind in ("mkdir", "create", "fsync", "rename", "remove"):
        assert kind in kinds, f"{kind} never recorded: {log.ops}"
    assert len(log.synced) >= 3  # weights, optimizer state and meta.json were fsynced with their bytes


def test_every_power_loss_during_a_commit_recovers_a_whole_checkpoint(commit, tmp_path: Path) -> None:
    start, log, weights = commit
    states = 0
    for done, kept, root in crash_states(start, log, tmp_path / "crash"):
        discard_incomplete(root)
        skipped: list[str] = []
        found = newest_checkpoint(root, warn=skipped.append)
        where = f"after {done} of {len(log.ops)} operations, {kept} on disk: {log.ops[:done]}"
        assert not skipped, f"a committed checkpoint was incomplete {where}: {skipped}"
        assert found is not None, f"no checkpoint left {where}"
        path, meta = found
        assert meta["update"] in (OLD, NEW)
        assert np.array_equal(np.load(path / CHECKPOINT_WEIGHTS), weights[meta["update"]])
        if done == len(log.ops):
            assert meta["update"] == NEW, f"write_checkpoint returned but NEW is not durable ({kept} on disk)"
        assert not [e for e in os.listdir(root / CHECKPOINTS_DIR) if e.startswith(".")]
        states += 1
    assert states > len(log.ops)


def test_the_model_catches_a_commit_without_fsync(commit, tmp_path: Path) -> None:
    """The same replay with the file fsyncs forgotten: the model must see a committed but empty checkpoint."""
    start, log, _ = commit
    careless = DiskLog(log.root, log.ops)
    failures = 0
    for _, _, root in crash_states(start, careless, tmp_path / "careless"):
        skipped: list[str] = []
        newest_checkpoint(root, warn=skipped.append)
        failures += bool(skipped)
    assert failures > 0


def test_every_power_loss_during_prepare_leaves_no_dataset_or_a_whole_one(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``prepare`` publishes a dataset by renaming its finished directory, manifest written last."""
    root = tmp_path / "out"
    root.mkdir()
    log = DiskLog(root)
    options = PrepareOptions(source=None, out=root / "ds", synthetic="600x5", classes=3, shard_mb=0.005)
    with monkeypatch.context() as patch:
        recording(patch, log)
        memtrain.prepare.pipeline.prepare(options, say=lambda *_: None)
    final = json.loads((root / "ds" / MANIFEST).read_text())
    assert sum(op[0] == "create" for op in log.ops) > 6  # several shards, the manifest, the work files
    complete = 0
    for done, kept, where in crash_states({}, log, tmp_path / "crash"):
        out = where / "ds"
        if done == len(log.ops):
            assert out.is_dir(), f"prepare returned but the dataset is not durable ({kept} on disk)"
        if out.exists():
            open_dataset(out, verify=True)  # every shard matches the manifest's size and checksum
            assert json.loads((out / MANIFEST).read_text()) == final
            complete += 1
    assert complete > 0
