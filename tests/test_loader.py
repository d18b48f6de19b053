"""The loader: ``Dataset.batches`` and ``memtrain.torch.BatchDataset`` give global batch k as the same rows in the
same order for any number of ranks and DataLoader workers, resume exactly from (epoch, batch), start in constant
time, never overwrite a batch the caller holds, and keep anonymous memory bounded."""

from __future__ import annotations

import gc
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

import memtrain.dataset as dataset_module
from memtrain.dataset import open_dataset
from memtrain.errors import InputError
from memtrain.order import WindowOrder

pytestmark = pytest.mark.timeout(120)
JOB = {"seed": 4, "epoch": 2, "window": 96}  # small windows: several per epoch on 900 rows


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1000, features=6, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, val_rows=100, shard_rows=300)


@pytest.fixture(scope="module")
def train() -> tuple[np.ndarray, np.ndarray]:
    x, y = blobs(n=1000, features=6, classes=3)
    return x[100:], y[100:]


def global_batches(ds, batch_size: int, **kw) -> list[tuple[np.ndarray, np.ndarray]]:
    return [(x.copy(), y.copy()) for x, y in ds.batches(batch_size, **JOB, **kw)]


def test_batches_are_the_rows_of_the_order_read_only_and_zero_copy_when_contiguous(dataset: Path, train) -> None:
    ds = open_dataset(dataset)
    order = ds.split("train").order(64, **JOB)
    got = list(ds.batches(64, **JOB))
    assert len(got) == order.batches == 15
    for k, (x, y) in enumerate(got):
        rows = np.asarray(order.batch(k))
        np.testing.assert_array_equal(x, train[0][rows])
        np.testing.assert_array_equal(y, train[1][rows])
        assert not x.flags.writeable and not y.flags.writeable
    assert sorted(np.concatenate([y for _, y in got]).tolist()) == sorted(train[1].tolist())
    x, _ = next(ds.batches(100, shuffle="none"))
    assert isinstance(x.base, np.memmap) or isinstance(x, np.memmap)  # a view of the mapped shard
    assert [len(x) for x, _ in ds.batches(400, shuffle="none", drop_last=True)] == [400, 400]


def test_a_kept_batch_is_never_overwritten_and_a_plain_loop_reuses_two_buffers(dataset: Path) -> None:
    ds = open_dataset(dataset)
    kept = list(ds.batches(64, **JOB))  # every gathered batch still referenced: none may be reused
    np.testing.assert_array_equal(np.concatenate([x for x, _ in kept]),
                                  np.concatenate([x for x, _ in global_batches(ds, 64)]))
    held = next(iter(ds.batches(64, **JOB)))[0][:5]  # a view of a view holds the buffer too
    snapshot = held.copy()
    buffers = set()
    for x, _ in ds.batches(64, **JOB):
        buffers.add(id(x.base))
    np.testing.assert_array_equal(held, snapshot)
    assert len(buffers) == 2


@pytest.mark.parametrize("world", [2, 4])
def test_ranks_yield_their_part_of_each_global_batch(dataset: Path, world: int) -> None:
    ds = open_dataset(dataset)
    whole = global_batches(ds, 64)
    parts = [global_batches(ds, 64, rank=r, world=world) for r in range(world)]
    for k, (x, y) in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([p[k][0] for p in parts]), x)
        np.testing.assert_array_equal(np.concatenate([p[k][1] for p in parts]), y)
        assert {len(p[k][0]) for p in parts} <= {len(x) // world, -(-len(x) // world)}


def test_start_reads_only_the_batches_from_start_on(dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ds = open_dataset(dataset)
    whole = global_batches(ds, 64)
    read, windows = [], []
    take_into, window_rows = dataset_module.take_into, WindowOrder.window_rows
    monkeypatch.setattr(dataset_module, "take_into", lambda source, rows, out: read.append(len(rows)) or take_into(
        source, rows, out))
    monkeypatch.setattr(WindowOrder, "window_rows", lambda self, w: windows.append(w) or window_rows(self, w))
    first = next(ds.batches(64, **JOB, start=12))
    assert read == [64, 64] and len(set(windows)) <= 2  # batch 12's x and y, its windows, nothing before it
    np.testing.assert_array_equal(first[0], whole[12][0])
    assert [len(x) for x, _ in ds.batches(64, **JOB, start=15)] == []
    with pytest.raises(InputError, match="start must be an integer from 0 to 15"):
        next(ds.batches(64, **JOB, start=16))


def test_bad_loader_arguments_are_refused_by_name(dataset: Path) -> None:
    ds = open_dataset(dataset)
    with pytest.raises(InputError, match="rank must be an integer from 0 to 1"):
        next(ds.batches(64, rank=2, world=2))
    with pytest.raises(InputError, match="unknown shuffle"):
        next(ds.batches(64, shuffle="row"))
    with pytest.raises(InputError, match="window"):
        next(ds.batches(64, window=-5))


def position(state: dict) -> tuple[int, int]:
    return state["epoch"], state["batch"]


def batch_dataset(dataset: Path, **kw):
    from memtrain.torch import BatchDataset

    return BatchDataset(open_dataset(dataset), 64, **JOB | kw)


def loader_batches(data, workers: int) -> list[tuple[np.ndarray, np.ndarray]]:
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no read-only warning from torch
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")  # 4 workers on 2 cores
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=workers,
                                             multiprocessing_context="fork" if workers else None)
        return [(x.numpy(), y.numpy()) for x, y in loader]


def test_batch_dataset_in_process_gives_fresh_writable_tensors_in_the_global_order(dataset: Path) -> None:
    import torch

    whole = global_batches(open_dataset(dataset), 64)
    data = batch_dataset(dataset)
    tensors = list(data)
    assert len(tensors) == len(data) == len(whole)
    assert position(data.state_dict()) == (3, 0)  # a finished epoch resumes at the next one
    for (x, y), (gx, gy) in zip(tensors, whole, strict=True):
        np.testing.assert_array_equal(x.numpy(), gx)
        np.testing.assert_array_equal(y.numpy(), gy)
        assert x.dtype == torch.float32 and y.dtype == torch.int64
    assert len({t[0].data_ptr() for t in tensors}) == len(tensors)  # no tensor shares memory with another
    tensors[0][0].add_(1.0)  # writable, and owned by the caller
    np.testing.assert_array_equal(next(iter(data))[0].numpy(), whole[0][0])
    assert len(pickle.dumps(data)) < 8_000  # paths and the manifest, not the rows


@pytest.mark.parametrize(("world", "workers"), [(1, 2), (2, 4)])
def test_dataloader_workers_and_ranks_yield_the_global_order(dataset: Path, world: int, workers: int) -> None:
    whole = global_batches(open_dataset(dataset), 64)
    parts = [loader_batches(batch_dataset(dataset, rank=r, world=world), workers) for r in range(world)]
    assert [len(p) for p in parts] == [len(whole)] * world
    for k, (x, y) in enumerate(whole):
        np.testing.assert_array_equal(np.concatenate([p[k][0] for p in parts]), x)
        np.testing.assert_array_equal(np.concatenate([p[k][1] for p in parts]), y)


def test_resume_mid_epoch_on_other_rank_and_worker_counts(dataset: Path) -> None:
    whole = global_batches(open_dataset(dataset), 64)
    first = batch_dataset(dataset, world=1)
    taken = []
    for x, _ in first:  # in process, 6 batches, then stop
        taken.append(x.numpy())
        if len(taken) == 6:
            break
    state = first.state_dict()
    assert position(state) == (JOB["epoch"], 6) and state == first.state_dict(consumed=6)
    parts = []
    for rank in range(2):  # resumed on 2 ranks with 2 workers each
        again = batch_dataset(dataset, epoch=0, rank=rank, world=2)
        again.load_state_dict(state)
        parts.append(loader_batches(again, 2))
    rest = [np.concatenate([parts[0][k][0], parts[1][k][0]]) for k in range(len(parts[0]))]
    np.testing.assert_array_equal(np.concatenate(taken + rest), np.concatenate([x for x, _ in whole]))
    with pytest.raises(InputError, match="BatchDataset state"):
        again.load_state_dict({"epoch": 1})
    with pytest.raises(InputError, match="start must be an integer from 0 to 15"):
        again.load_state_dict({"epoch": 0, "batch": 99})
    assert again.state_dict(consumed=0) == state  # a refused position changes nothing
    again.set_epoch(JOB["epoch"] + 1)
    assert position(again.state_dict()) == (JOB["epoch"] + 1, 0)


MEMORY_PROBE = """
import sys, numpy as np
from memtrain.dataset import open_dataset
from memtrain.torch import BatchDataset

def anon_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))

ds = open_dataset(sys.argv[1])
epochs = int(sys.argv[2])
before = anon_kib()  # libraries imported, dataset opened, nothing read
for epoch in range(epochs):
    for x, y in ds.batches(4096, seed=1, epoch=epoch, window=1 << 16):
        x.sum()
    for x, y in BatchDataset(ds, 4096, seed=1, epoch=epoch):
        del x, y  # the loader has read every row into the tensor; a torch sum here would only cost time
    if epoch == 0:
        first = anon_kib()
print(first - before, anon_kib() - first)
"""


def anonymous_growth(tmp_path: Path, rows: int, features: int, epochs: int) -> tuple[int, int]:
    """KiB of anonymous memory a process gains in its first epoch, and over the epochs after it."""
    rng = np.random.default_rng(0)
    x = rng.random((rows, features), dtype=np.float32)
    data = write_dataset(tmp_path / "big", x, (np.arange(rows) % 10).astype(np.int64), val_rows=1000,
                         shard_rows=rows // 4)
    del x
    gc.collect()
    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(data), str(epochs)], capture_output=True, text=True,
                         timeout=600, check=True)
    first, later = out.stdout.split()
    return int(first), int(later)


def test_anonymous_memory_does_not_grow_over_epochs(tmp_path: Path) -> None:
    """Fast: a 51 MB dataset, 3 epochs; the dataset is mapped, never copied into private memory. (The first
    epoch's 5 to 12 MiB are the gather buffers, a window's order and the allocators' retained blocks,
    whatever the dataset size: see the slow test.)"""
    first, later = anonymous_growth(tmp_path, 200_000, 64, 3)
    assert first + later < 24_576 and later < 8_192  # KiB, against 51,200 of rows read each epoch


@pytest.mark.slow
def test_anonymous_memory_stays_bounded_on_a_dataset_of_several_hundred_mb(tmp_path: Path) -> None:
    first, later = anonymous_growth(tmp_path, 1_500_000, 64, 4)  # 384 MB of rows, 4 epochs
    assert first + later < 32_768 and later < 16_384


@pytest.mark.parametrize("shuffle", ["batches", "none"])
def test_batch_dataset_copies_contiguous_batches_across_shards(dataset: Path, train, shuffle: str) -> None:
    order = open_dataset(dataset).split("train").order(64, shuffle=shuffle, **JOB)
    got = list(batch_dataset(dataset, shuffle=shuffle))  # 64-row ranges; shards end at rows 300 and 600
    assert len(got) == order.batches
    for k, (x, y) in enumerate(got):
        rows = order.batch(k)
        np.testing.assert_array_equal(x.numpy(), train[0][rows.start:rows.stop])
        np.testing.assert_array_equal(y.numpy(), train[1][rows.start:rows.stop])


def test_a_class_sorted_dataset_prepared_without_shuffle_gets_mixed_batches(tmp_path: Path, cli) -> None:
    """End to end: `memtrain prepare --no-shuffle` of rows sorted by class, then the loader's batches."""
    y = np.repeat(np.arange(10), 2_000)
    x = np.random.default_rng(0).normal(size=(len(y), 4)).astype(np.float32) + y[:, None]
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    result = cli("prepare", tmp_path / "x.npy", tmp_path / "ds", "--y", tmp_path / "y.npy", "--no-shuffle",
                 "--shard-mb", "0.1", "--quiet")
    assert result.code == 0, result.err
    ds = open_dataset(tmp_path / "ds")
    labels = ds[:][1]
    assert len(ds.split("train").shards) > 3 and np.all(np.diff(labels) >= 0)  # still sorted, several shards

    def classes_per_batch(shuffle: str, epoch: int) -> float:
        counts = [len(np.unique(y)) for _, y in ds.batches(256, epoch=epoch, shuffle=shuffle, window=4096)]
        return float(np.mean(counts))

    assert classes_per_batch("batches", 0) < 1.2  # fixed contiguous batches: one class each
    assert classes_per_batch("rows", 0) > 6 and classes_per_batch("rows", 1) > 6
    every = np.concatenate([y for _, y in ds.batches(256, epoch=1, window=4096)])
    np.testing.assert_array_equal(np.sort(every), labels)  # every row once


# --- the workers' shared ring (memtrain/ring.py) ---


def ring_spans() -> list[tuple[int, int]]:
    """The address ranges of the worker rings this process has mapped."""
    from memtrain import ring

    return [(a, a + len(m.map)) for m in ring._MAPPED.values() for a in [np.frombuffer(m.map, np.uint8).ctypes.data]]


def in_ring(tensor, spans: list[tuple[int, int]]) -> bool:
    return any(lo <= tensor.data_ptr() < hi for lo, hi in spans)


@pytest.mark.filterwarnings("ignore:.*worker processes in total")  # 4 workers on 2 cores
@pytest.mark.parametrize("workers", [2, 4])
def test_workers_hand_batches_over_through_their_rings_in_the_global_order(dataset: Path, workers: int) -> None:
    """A plain loop (each batch dropped before the next): every batch arrives in a slot of its worker's ring
    (only the slot's number crossed the queue), in the global order; the slots are reused, so the memory
    the batches take is the rings', a few batches per worker, however long the epoch."""
    import torch

    from memtrain import ring
    from memtrain.torch import BatchDataset

    whole = global_batches(open_dataset(dataset), 16)
    ring._MAPPED.clear()
    loader = torch.utils.data.DataLoader(BatchDataset(open_dataset(dataset), 16, **JOB), batch_size=None,
                                         num_workers=workers,
                                         multiprocessing_context="fork")
    got, addresses = [], set()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no read-only warning from torch
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        for x, y in loader:
            assert in_ring(x, ring_spans()) and in_ring(y, ring_spans())
            addresses.add(x.data_ptr())
            got.append((x.numpy().copy(), y.numpy().copy()))
            x.add_(1.0)  # writable, and the worker never reads it back
            del x, y
    assert len(ring._MAPPED) == workers and len(got) == len(whole) == 57
    assert len(addresses) <= workers * ring.SLOTS < len(whole)
    for (x, y), (gx, gy) in zip(got, whole, strict=True):
        np.testing.assert_array_equal(x, gx)
        np.testing.assert_array_equal(y, gy)


def test_a_batch_held_from_a_ring_is_never_overwritten(dataset: Path) -> None:
    """Holding every batch of an epoch (or only a view of one) keeps its slot: a worker whose slots are all
    held sends the next batch the torch way, and every batch held to the end still has its rows."""
    import torch

    from memtrain import ring

    whole = global_batches(open_dataset(dataset), 64)
    ring._MAPPED.clear()
    loader = torch.utils.data.DataLoader(batch_dataset(dataset), batch_size=None, num_workers=2,
                                         multiprocessing_context="fork")
    held = []
    for k, (x, y) in enumerate(loader):
        held.append((x[1:3], y) if k % 2 else (x, y))  # a view of x keeps its slot as well as x does
        del x, y
    spans = ring_spans()
    assert sum(in_ring(y, spans) for _, y in held) == 2 * ring.SLOTS  # the rings filled, then torch's way
    for k, ((x, y), (gx, gy)) in enumerate(zip(held, whole, strict=True)):
        np.testing.assert_array_equal(x.numpy(), gx[1:3] if k % 2 else gx)
        np.testing.assert_array_equal(y.numpy(), gy)


@pytest.mark.filterwarnings("ignore:.*worker processes in total")  # 4 workers on 2 cores
def test_resume_mid_epoch_from_four_workers_to_two(dataset: Path) -> None:
    import torch

    whole = global_batches(open_dataset(dataset), 64)
    data = batch_dataset(dataset)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=4, multiprocessing_context="fork")
    taken = []
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*worker processes in total.*")
        for x, _ in loader:
            taken.append(x.numpy().copy())
            if len(taken) == 7:
                break
    state = data.state_dict(consumed=len(taken))
    again = batch_dataset(dataset, epoch=0)
    again.load_state_dict(state)
    rest = [x for x, _ in loader_batches(again, 2)]
    np.testing.assert_array_equal(np.concatenate(taken + rest), np.concatenate([x for x, _ in whole]))


def test_the_main_process_keeps_the_rings_of_live_workers_only(dataset: Path) -> None:
    """Epoch after epoch (new workers each time), the rings mapped in this process stay as many as the
    workers: a finished worker's ring is unmapped once nothing of it is held (no growth over epochs)."""
    import gc

    import torch

    def ring_maps() -> int:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            return sum("memtrain-ring" in line for line in maps)

    data = batch_dataset(dataset)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="fork")
    counts = []
    for epoch in range(5):
        data.set_epoch(epoch)
        for x, y in loader:
            del x, y
        gc.collect()
        counts.append(ring_maps())
    assert counts[0] >= 2 and max(counts) <= 4, counts  # this epoch's 2 rings, and at most the last epoch's 2


@pytest.mark.parametrize("world", [1, 3])
def test_batch_dataset_rows_are_the_orders_rows_across_windows_and_shards(dataset: Path, train, world: int) -> None:
    """BatchDataset gathers a rows order through the joined shards' places (issue 43): every rank's batch is
    still exactly the source rows of its part of ``order.batch(k)``, across window boundaries (window=64: 15
    windows, batches straddling them) and shards, and a dataset iterated once still pickles as paths."""
    from memtrain.order import rank_part
    from memtrain.torch import BatchDataset

    order = open_dataset(dataset).split("train").order(48, **JOB | {"window": 64})
    for rank in range(world):
        data = BatchDataset(open_dataset(dataset), 48, rank=rank, world=world, **JOB | {"window": 64})
        got = list(data)
        assert len(got) == order.batches
        for k, (x, y) in enumerate(got):
            rows = np.asarray(rank_part(order.batch(k), rank, world))
            np.testing.assert_array_equal(x.numpy(), train[0][rows])
            np.testing.assert_array_equal(y.numpy(), train[1][rows])
        assert len(pickle.dumps(data)) < 8_000
