"""memtrain/joined.py: a split's shards as one array, so that a gather across shards is one take."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_data import write_dataset

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
