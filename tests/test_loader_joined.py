"""memtrain/joined.py: a split's shards as one array, so that a gather across shards is one take."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_data import write_dataset

import memtrain.dataset as dataset_module
from memtrain.dataset import Split, open_dataset
from memtrain.joined import place

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    x = rng.random((1000, 5), dtype=np.float32)  # 20-byte rows: shards start off any common page stride
    y = rng.integers(0, 7, 1000).astype(np.int64)
    root = write_dataset(tmp_path_factory.mktemp("joined") / "data", x, y, val_rows=10, shard_rows=23)
    return root, x[10:], y[10:]


def test_a_gather_across_many_shards_is_one_take_and_gives_the_rows(many_shards, monkeypatch) -> None:
    root, x, y = many_shards
    split = open_dataset(root).split("train")
    assert len(split.shards) == 44
    split.gather(np.arange(3), (np.empty((3, 5), np.float32), np.empty(3, np.int64)))  # one shard: direct
    monkeypatch.setattr(Split, "_plain", lambda *_: pytest.fail("gathered shard by shard"))
    rng = np.random.default_rng(0)
    for _ in range(20):
        rows = rng.choice(len(x), 64, replace=False)  # rows of many shards, in no order
        out = split.gather(rows, (np.empty((64, 5), np.float32), np.empty(64, np.int64)))
        np.testing.assert_array_equal(out[0], x[rows])
        np.testing.assert_array_equal(out[1], y[rows])
    (joined_x, _), _ = split._joined()
    assert not joined_x.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        joined_x[0, 0] = 1.0


def test_shards_are_placed_on_one_row_stride_or_not_at_all() -> None:
    page = 4096
    places = place([128, 128, 192], [128 + 23 * 20, 128 + 23 * 20, 192 + 7 * 20], 20, page)
    assert places is not None and all(at % page == 0 for at in places)
    assert all((at + off - 128) % 20 == 0 for at, off in zip(places, [128, 128, 192], strict=True))
    assert all(b >= a + 128 + 23 * 20 for a, b in zip(places, places[1:], strict=False))  # no overlap
    assert place([128, 192], [128 + 4096, 192 + 4096], 256, page) is None  # 64 bytes off a 256-byte stride


LIMITED = """
import resource, sys, numpy as np
from memtrain.dataset import open_dataset
with open("/proc/self/status") as f:
    data = next(int(l.split()[1]) << 10 for l in f if l.startswith("VmData:"))
split = open_dataset(sys.argv[1]).split("train")
resource.setrlimit(resource.RLIMIT_DATA, (data + (8 << 20), data + (8 << 20)))
rows = np.random.default_rng(0).permutation(split.rows)[:512]
x, y = split.gather(rows, (np.empty((512, *split.x_shape), split.x_dtype), np.empty(512, split.y_dtype)))
print(split._joined() is not None, float(x.sum()))
"""


def test_the_joined_shards_do_not_count_as_private_memory(tmp_path: Path) -> None:
    """The reserved range and the file maps are not private writable memory: a process whose RLIMIT_DATA
    allows 8 MiB more joins 32 MB of shards."""
    x = np.random.default_rng(1).random((125_000, 64), dtype=np.float32)
    root = write_dataset(tmp_path / "data", x, np.zeros(len(x), np.int64), val_rows=1000, shard_rows=8000)
    out = subprocess.run([sys.executable, "-c", LIMITED, str(root)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "True"


@pytest.mark.parametrize(("window", "start", "rank", "world", "drop_last"),
                         [(128, 0, 0, 1, False), (100, 3, 1, 3, False), (1 << 16, 0, 2, 4, True), (64, 5, 0, 2, True)])
def test_rows_order_batches_from_the_joined_shards_are_the_orders_rows(many_shards, window, start, rank, world,
                                                                       drop_last) -> None:
    """ds.batches in rows order takes from the joined shards (places made a window at a time): batch k is
    still rank ``rank``'s part of ``order.batch(k)``, in its order, across windows and 44 shards."""
    root, x, y = many_shards
    split = open_dataset(root).split("train")
    order = split.order(48, seed=5, epoch=2, window=window, drop_last=drop_last)
    got = list(split.batches(48, seed=5, epoch=2, window=window, drop_last=drop_last, start=start, rank=rank,
                             world=world))
    assert len(got) == order.batches - start
    for k, (bx, by) in enumerate(got, start=start):
        rows = np.asarray(order.batch(k))
        part = rows[len(rows) * rank // world:len(rows) * (rank + 1) // world]
        np.testing.assert_array_equal(bx, x[part])
        np.testing.assert_array_equal(by, y[part])
        assert not bx.flags.writeable and not by.flags.writeable


def test_rows_order_places_are_worked_out_once_a_window_not_once_a_batch(many_shards, monkeypatch) -> None:
    """Issue 43: per batch, the gather is its two takes; a row's shard is looked up for a whole window at
    once (per batch it cost about 9 us of a batch's 60), and with shards of equal rows by a division, not a
    searchsorted (which, for a window's rows in no order, cost as much as shuffling them)."""
    root, x, _ = many_shards
    split = open_dataset(root).split("train")
    split._joined()  # mapped before counting
    lookups, searches = [], []
    shards_of, searchsorted = dataset_module.shards_of, np.searchsorted
    monkeypatch.setattr(dataset_module, "shards_of", lambda *a: lookups.append(1) or shards_of(*a))
    monkeypatch.setattr(np, "searchsorted", lambda *a, **k: searches.append(1) or searchsorted(*a, **k))
    order = split.order(16, seed=1, window=256)
    windows = len(order.window_starts) - 1
    assert order.batches > 4 * windows  # many batches a window
    assert sum(len(bx) for bx, _ in split.batches(16, seed=1, window=256)) == len(x)
    assert len(lookups) == windows and not searches


@pytest.mark.parametrize("sizes", [[23, 23, 23, 1], [23, 23, 40], [5, 7, 18], [9], [4, 0, 4, 2], [6, 6]])
def test_the_shard_of_a_row_is_the_one_searchsorted_names(sizes) -> None:
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    rows = np.random.default_rng(0).permutation(int(starts[-1]))
    stride = dataset_module.shard_stride(starts)
    assert stride == (sizes[0] if len(sizes) > 1 and len(set(sizes[:-1])) == 1 and sizes[0] else None)
    np.testing.assert_array_equal(dataset_module.shards_of(rows, starts, stride),
                                  np.searchsorted(starts, rows, side="right") - 1)


def test_a_window_order_gives_any_batch_in_any_order(many_shards) -> None:
    """batch(k) remembers the window the batch before ended in (a shortcut for batches read in turn): batches
    asked for out of turn are the rows a fresh order gives."""
    root, _, _ = many_shards
    split = open_dataset(root).split("train")
    walked = split.order(40, seed=2, window=128)
    ks = list(range(walked.batches)) + list(range(walked.batches - 1, -1, -3)) + [0, walked.batches - 1, 3]
    for k in ks:
        np.testing.assert_array_equal(walked.batch(k), split.order(40, seed=2, window=128).batch(k))
