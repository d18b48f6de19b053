"""HDF5 sources stored plainly are read as views of the mapped file; every other layout through h5py.

Whichever way a dataset is read, the rows are h5py's own, for every chunking of the reads, and a prepare
of it gives the bytes a prepare of the same rows from .npy gives.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import pytest

from memtrain.prepare import PrepareOptions, prepare
from memtrain.prepare.hdf5_layout import map_rows, stored_runs
from memtrain.prepare.hdf5_source import Hdf5Source
from tests.dataset_files import dataset_bytes

ROWS, FEATURES = 203, 6


def rows() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return rng.standard_normal((ROWS, FEATURES)), rng.integers(0, 4, ROWS)


def interleaved(handle: h5py.File, x: np.ndarray, y: np.ndarray, x_chunks: tuple[int, ...],
                y_chunks: tuple[int, ...]) -> None:
    """x and y written a few rows at a time, as a logger does: the chunks of x lie in several runs."""
    hx = handle.create_dataset("x", shape=x.shape, dtype=x.dtype, chunks=x_chunks)
    hy = handle.create_dataset("y", shape=y.shape, dtype=y.dtype, chunks=y_chunks)
    for lo in range(0, len(x), 50):
        hx[lo:lo + 50] = x[lo:lo + 50]
        hy[lo:lo + 50] = y[lo:lo + 50]
        handle.flush()  # the chunks written so far get their place in the file now, x's before y's


def compact(handle: h5py.File, x: np.ndarray, y: np.ndarray) -> None:
    plist = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    plist.set_layout(h5py.h5d.COMPACT)
    small = x[:20].astype(np.float32)
    dataset = h5py.h5d.create(handle.id, b"x", h5py.h5t.py_create(small.dtype), h5py.h5s.create_simple(small.shape),
                              dcpl=plist)
    dataset.write(h5py.h5s.ALL, h5py.h5s.ALL, small)
    handle["y"] = y[:20]


def unallocated(handle: h5py.File, x: np.ndarray, y: np.ndarray) -> None:
    hx = handle.create_dataset("x", shape=x.shape, dtype=x.dtype, chunks=(16, FEATURES), fillvalue=7.0)
    hx[:40] = x[:40]  # chunks past row 47 are never written: h5py gives the fill value
    handle["y"] = y


PLAIN: dict[str, Callable[[h5py.File, np.ndarray, np.ndarray], None]] = {
    "contiguous": lambda h, x, y: (h.create_dataset("x", data=x), h.create_dataset("y", data=y)),
    "chunks of whole rows, interleaved": lambda h, x, y: interleaved(h, x, y, (16, FEATURES), (32,)),
    "big-endian float32": lambda h, x, y: (h.create_dataset("x", data=x.astype(">f4"), chunks=(9, FEATURES)),
                                           h.create_dataset("y", data=y.astype(">i2"))),
    "three-dimensional rows": lambda h, x, y: (h.create_dataset("x", data=x.reshape(ROWS, 3, 2), chunks=(10, 3, 2)),
                                               h.create_dataset("y", data=y)),
}
READ: dict[str, Callable[[h5py.File, np.ndarray, np.ndarray], None]] = {
    "gzip": lambda h, x, y: (h.create_dataset("x", data=x, chunks=(16, FEATURES), compression="gzip"),
                             h.create_dataset("y", data=y, chunks=(16,), compression="gzip")),
    "shuffle and checksum filters": lambda h, x, y: (
        h.create_dataset("x", data=x, chunks=(16, FEATURES), shuffle=True, fletcher32=True),
        h.create_dataset("y", data=y, chunks=(16,), fletcher32=True)),
    "chunks that split a row": lambda h, x, y: interleaved(h, x, y, (16, 2), (16,)),
    "unallocated chunks": unallocated,
    "compact": compact,
}


def is_mapped(array: np.ndarray) -> bool:
    """``array`` is a view of a mapped file (not a copy in anonymous memory)."""
    while array is not None:
        if isinstance(array, (np.memmap, mmap.mmap)):
            return True
        array = getattr(array, "base", None)
    return False


def not_any(flags) -> bool:
    return not any(flags)


def write(tmp_path: Path, layout: Callable) -> Path:
    path = tmp_path / "a.h5"
    with h5py.File(path, "w") as handle:
        layout(handle, *rows())
    return path


def check_chunks(path: Path, per_chunk: int) -> list[tuple[bool, bool]]:
    """Hdf5Source's chunks against h5py's read of the same rows; (x mapped, y mapped) for each."""
    source = Hdf5Source(path, None, None)
    with h5py.File(path, "r") as handle:
        want_x, want_y = handle["x"][()], handle["y"][()]
    found, at = [], 0
    for chunk in source.chunks(per_chunk):
        n = len(chunk.x)
        assert chunk.first_row == at
        assert chunk.x.tobytes() == want_x[at:at + n].reshape(n, *source.feature_shape).tobytes()
        assert chunk.x.dtype == want_x.dtype and chunk.y.dtype == want_y.dtype
        np.testing.assert_array_equal(chunk.y, want_y[at:at + n])
        found.append((is_mapped(chunk.x), is_mapped(chunk.y)))
        at += n
    assert at == len(want_x)
    return found


@pytest.mark.parametrize("layout", list(PLAIN))
def test_a_plainly_stored_dataset_is_read_from_the_mapped_file(tmp_path, layout):
    path = write(tmp_path, PLAIN[layout])
    for per_chunk in (1, 7, 16, 50, 1000):
        mapped = check_chunks(path, per_chunk)
        # interleaved: a chunk of reads across two runs (all rows at once, say) is joined, a copy
        expect = all if layout != "chunks of whole rows, interleaved" else any if per_chunk < ROWS else not_any
        assert expect(x for x, _ in mapped) and expect(y for _, y in mapped), (layout, per_chunk)
    with h5py.File(path, "r") as handle:
        runs = stored_runs(handle, handle["x"])
    assert runs is not None and sum(run.rows for run in runs) == ROWS
    assert len(runs) > 1 if layout == "chunks of whole rows, interleaved" else len(runs) == 1


@pytest.mark.parametrize("layout", list(READ))
def test_any_other_layout_is_read_by_h5py(tmp_path, layout):
    path = write(tmp_path, READ[layout])
    with h5py.File(path, "r") as handle:
        assert map_rows(path, handle, handle["x"]) is None
    for per_chunk in (1, 16, 1000):
        assert not any(x for x, _ in check_chunks(path, per_chunk))


def test_a_map_that_disagrees_with_h5py_is_not_used(tmp_path, monkeypatch):
    path = write(tmp_path, PLAIN["contiguous"])
    with h5py.File(path, "r") as handle:
        runs = stored_runs(handle, handle["x"])
        monkeypatch.setattr("memtrain.prepare.hdf5_layout.stored_runs",
                            lambda *_: [type(runs[0])(first=0, rows=ROWS, offset=runs[0].offset + 8)])
        assert map_rows(path, handle, handle["x"]) is None


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_mapped_source_prepares_to_the_bytes_of_the_same_rows_from_npy(tmp_path, shuffle):
    x, y = rows()
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", y)
    source = write(tmp_path, PLAIN["chunks of whole rows, interleaved"])
    common = {"shuffle": shuffle, "chunk_mb": 0.003, "shard_mb": 0.002, "seed": 4}  # 61 rows a chunk of reads
    for options in (PrepareOptions(tmp_path / "x.npy", tmp_path / "npy", y=str(tmp_path / "y.npy"), **common),
                    PrepareOptions(source, tmp_path / "h5", **common)):
        prepare(options, say=lambda _: None, force_plain=True)
    ignore = ["source", "options"]  # they name the source files
    assert dataset_bytes(tmp_path / "h5", ignore=ignore) == dataset_bytes(tmp_path / "npy", ignore=ignore)
