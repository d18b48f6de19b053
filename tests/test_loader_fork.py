"""A loader batch held across a fork: a batch a DataLoader worker handed over through its ring (memtrain/ring.py) and
held by a forked child, or by its parent, keeps its rows whatever the other process does with its own copy."""

from __future__ import annotations

import gc
import multiprocessing
import os
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

from memtrain.dataset import open_dataset

pytestmark = pytest.mark.timeout(120)
JOB = {"seed": 4, "epoch": 2, "window": 96}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1000, features=6, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, val_rows=100, shard_rows=300)


def loader(dataset: Path):
    import torch

    from memtrain.torch import BatchDataset

    return torch.utils.data.DataLoader(BatchDataset(open_dataset(dataset), 16, **JOB), batch_size=None,
                                       num_workers=2, multiprocessing_context="fork")


def in_a_ring(tensor) -> bool:
    from memtrain import ring

    spans = [(a, a + len(m.map)) for m in ring._MAPPED.values() for a in [m.counts.ctypes.data]]
    return any(lo <= tensor.data_ptr() < hi for lo, hi in spans)


@pytest.mark.parametrize("private", [True, False])
def test_a_batch_a_forked_child_holds_keeps_its_rows_when_the_parent_lets_go(dataset: Path, private: bool,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The parent forks a worker of its own (multiprocessing, fork) holding a ring batch, drops the batch and runs
    the epoch on, so the DataLoader's workers reuse every slot; the child's batch still has its rows. (Where the
    child cannot make its map private, the slots held at the fork are never reused.)"""
    from memtrain import ring

    if not private:
        monkeypatch.setattr(ring, "libc", lambda: None)
    batches = iter(loader(dataset))
    held = list(next(batches))
    assert in_a_ring(held[0]) and in_a_ring(held[1])
    rows = [tensor.numpy().copy() for tensor in held]
    go = multiprocessing.get_context("fork").Event()

    def child() -> None:
        go.wait(60)
        os._exit(0 if all(np.array_equal(t.numpy(), r) for t, r in zip(held, rows, strict=True)) else 3)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    held.clear()  # the parent lets go
    gc.collect()
    rest = [x.numpy().copy() for x, _ in batches]  # 56 more batches through 2 x 4 slots: each slot reused
    assert len(rest) == 56
    go.set()
    process.join(60)
    assert process.exitcode == 0, "the child's batch was overwritten"
    pinned = [count for mapped in ring._MAPPED.values() for count in mapped.counts.tolist() if count > 2]
    # pinned: the slots held or in flight at the fork, since let go of in the parent (x and y: 2 releases)
    assert set(pinned) == (set() if private else {ring.PINNED - 2})


def test_a_batch_the_parent_holds_keeps_its_rows_when_a_forked_child_lets_go(dataset: Path) -> None:
    """The other way: a child forked with the parent's batches drops them (their finalizers run in the child)
    and exits; the parent, still holding them, runs the epoch on and finds their rows intact."""
    batches = iter(loader(dataset))
    held = [next(batches) for _ in range(3)]
    rows = [(x.numpy().copy(), y.numpy().copy()) for x, y in held]
    assert all(in_a_ring(x) for x, _ in held)
    pid = os.fork()
    if pid == 0:  # the child: let go of every batch, run their finalizers, leave without pytest's teardown
        try:
            held.clear()
            gc.collect()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    assert len([x.numpy().sum() for x, _ in batches]) == 54  # every free slot reused
    for (x, y), (gx, gy) in zip(held, rows, strict=True):
        np.testing.assert_array_equal(x.numpy(), gx)
        np.testing.assert_array_equal(y.numpy(), gy)


def test_dataloader_workers_forked_while_ring_batches_are_held_leave_them_intact(dataset: Path) -> None:
    """Starting a second DataLoader (its workers forked from this process) while holding the first one's batches:
    both loaders' batches are right, and the held ones keep their rows to the end."""
    first = iter(loader(dataset))
    held = [next(first) for _ in range(2)]
    rows = [x.numpy().copy() for x, _ in held]
    whole = [x.copy() for x, _ in open_dataset(dataset).batches(16, **JOB)]
    second = [x.numpy().copy() for x, _ in loader(dataset)]
    rest = [x.numpy().copy() for x, _ in first]
    for got, want in zip(second, whole, strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(np.concatenate(rows + rest), np.concatenate(whole))
    for (x, _), want in zip(held, rows, strict=True):
        np.testing.assert_array_equal(x.numpy(), want)


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_fork_in_a_process_with_over_1024_open_files_still_waits_for_the_childs_copy(dataset: Path) -> None:
    """A run raises its open-files limit (a mapped buffer per task) and may hold more than 1024 descriptors, past
    what select() can watch: the parent's wait for the child's copy must still work (it raised ValueError in the
    fork hook, unwaited, so the parent could reuse a slot before the child had copied it)."""
    import resource

    from memtrain import ring

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.fail(f"this test needs an open-files hard limit of at least 1200, found {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        batches = iter(loader(dataset))
        held = list(next(batches))
        assert in_a_ring(held[0])
        rows = [tensor.numpy().copy() for tensor in held]
        process = multiprocessing.get_context("fork").Process(
            target=lambda: os._exit(0 if all(np.array_equal(t.numpy(), r) for t, r in zip(held, rows, strict=True))
                                    else 3))
        process.start()
        process.join(60)
        assert process.exitcode == 0
        held.clear()
        gc.collect()
        assert sum(1 for _ in batches) == 56
        assert not [c for m in ring._MAPPED.values() for c in m.counts.tolist() if c >= ring.PINNED - 2]
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
