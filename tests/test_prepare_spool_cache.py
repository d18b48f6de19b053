"""Pass 2 drops the page cache of each spool bucket once it has read it for the last time.

The spool is clean after ``Spool.finish`` (fsynced) and is deleted at the end, so its cached pages are of no
further use; dropped, they are the memory the shards take next, instead of new pages (measured in
docs/prepare-performance.md). Residency is read with mincore(2) on a private map of each file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from pathlib import Path

import numpy as np
import pytest

from memtrain.layout import spool_bucket_names
from memtrain.prepare.shuffle import Spool, gather

pytestmark = pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="posix_fadvise is Linux/BSD only")


def resident_pages(path: Path) -> int:
    """How many of the file's pages are in the page cache."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    size = path.stat().st_size
    pages = -(-size // mmap.PAGESIZE)
    with open(path, "rb") as handle:
        mapped = mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        flags = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapped))
        if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(size), flags) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        return sum(flag & 1 for flag in flags)
    finally:
        mapped.close()


def spool(tmp_path: Path, buckets: int) -> tuple[Path, list[int], np.ndarray]:
    folder = tmp_path / "spool"
    folder.mkdir()
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((8000, 16)).astype(np.float32)
    with Spool(folder, buckets, seed=1) as writer:
        for block in np.split(rows, 4):
            writer.add(block, np.arange(len(block), dtype=float))
        counts = writer.finish()
    return folder, counts, rows


@pytest.mark.parametrize("shuffle", [True, False])
def test_each_bucket_leaves_the_page_cache_once_gathered(tmp_path, shuffle):
    folder, counts, rows = spool(tmp_path, 3 if shuffle else 1)
    files = [folder / name for bucket in range(len(counts)) for name in spool_bucket_names(bucket)]
    assert all(resident_pages(path) > 0 for path in files)  # just written: cached
    pieces = gather(folder, counts, (16,), np.dtype(np.float32), seed=1, shuffle=shuffle, piece_rows=700)
    first = next(pieces)
    assert resident_pages(files[0]) > 0  # the bucket being read stays
    got = np.concatenate([first[0], *(x for x, _ in pieces)])
    if shuffle:
        assert [resident_pages(path) for path in files] == [0] * len(files)
        got = got[np.lexsort(got.T)]
        rows = rows[np.lexsort(rows.T)]
    # unshuffled, the pieces are views of the bucket's map: what was dropped is read again from the file
    np.testing.assert_array_equal(got, rows)
