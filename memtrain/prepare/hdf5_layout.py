"""An HDF5 dataset stored plainly -> its rows as views of the mapped file, as a .npy source gives them.

A dataset without filters (no compression, shuffle or checksum), stored contiguously or in allocated
chunks that each hold whole rows, keeps its rows as plain bytes in the file. A range of rows is then a
view of the file mapped read-only, with no copy through HDF5's read path into a fresh array (for a 1 GB
source that copy touched 1 GB of new memory per pass; see docs/prepare-performance.md). Consecutive
chunks that are also consecutive in the file form one run; a range that crosses runs is joined (one copy
of that range). Anything else gives ``None`` and is read by h5py as before: filters, chunks that split a
row, unallocated chunks (read as the fill value), compact, external or virtual storage, a user block,
a non-numeric dtype, a dataset past the end of the file (h5py's read then names the damage),
or a map that does not give h5py's own first and last rows.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

# Beyond this many chunks, listing them (and joining tiny runs) would cost more than reading through h5py.
MAX_CHUNKS = 1 << 20
# Without h5py's chunk iterator (HDF5 < 1.12.3), each chunk is looked up by index: only a few, then.
MAX_INDEXED_CHUNKS = 4096


@dataclass(frozen=True)
class Run:
    """Rows ``first .. first + rows - 1`` of a dataset, stored one after the other from byte ``offset``."""

    first: int
    rows: int
    offset: int


class MappedRows:
    """Rows of one dataset, cut from a read-only map of its file; ``rows(lo, hi)`` is a view when it can be."""

    def __init__(self, path: Path, runs: list[Run], dtype: np.dtype, row_shape: tuple[int, ...]):
        whole = np.memmap(path, dtype=np.uint8, mode="r")
        row_bytes = math.prod(row_shape) * dtype.itemsize
        self.runs = runs
        self._firsts = [run.first for run in runs]
        self._views = [whole[run.offset:run.offset + run.rows * row_bytes].view(dtype).reshape(run.rows, *row_shape)
                       for run in runs]

    def rows(self, lo: int, hi: int) -> np.ndarray:
        """Rows ``lo .. hi - 1`` (within the dataset)."""
        index = bisect_right(self._firsts, lo) - 1
        parts = []
        while lo < hi:
            first, view = self._firsts[index], self._views[index]
            take = min(hi, first + len(view)) - lo
            parts.append(view[lo - first:lo - first + take])
            lo, index = lo + take, index + 1
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def map_rows(path: Path, handle: h5py.File, dataset: h5py.Dataset) -> MappedRows | None:
    """The dataset's rows mapped from ``path`` (the file ``handle`` has open), or None: read it with h5py."""
    try:
        return _checked_map(path, handle, dataset)
    except (OSError, ValueError):  # a damaged file: h5py's read, in the caller, names the rows
        return None


def _checked_map(path: Path, handle: h5py.File, dataset: h5py.Dataset) -> MappedRows | None:
    runs = stored_runs(handle, dataset)
    if runs is None:
        return None
    row_shape = tuple(dataset.shape[1:])
    end = max(run.offset + run.rows * math.prod(row_shape) * dataset.dtype.itemsize for run in runs)
    if end > path.stat().st_size:  # truncated: h5py's read reports it
        return None
    mapped = MappedRows(path, runs, dataset.dtype, row_shape)
    rows = dataset.shape[0]
    for lo in (0, rows - 1):
        if mapped.rows(lo, lo + 1).tobytes() != np.asarray(dataset[lo:lo + 1]).tobytes():
            return None
    return mapped


def stored_runs(handle: h5py.File, dataset: h5py.Dataset) -> list[Run] | None:
    """Where the dataset's rows lie in the file, as runs of consecutive rows; None unless stored plainly."""
    dtype, shape = dataset.dtype, dataset.shape
    if dtype.kind not in "biuf" or dtype.fields is not None or dtype.subdtype is not None or len(shape) == 0 \
            or shape[0] == 0 or handle.userblock_size or dataset.is_virtual or dataset.external:
        return None
    plist = dataset.id.get_create_plist()
    if plist.get_nfilters():
        return None
    row_bytes = math.prod(shape[1:]) * dtype.itemsize
    layout = plist.get_layout()
    if layout == h5py.h5d.CONTIGUOUS:
        offset = dataset.id.get_offset()
        chunk_rows, starts = shape[0], None if offset is None else [(0, offset)]
    elif layout == h5py.h5d.CHUNKED and tuple(dataset.chunks[1:]) == tuple(shape[1:]):
        chunk_rows = dataset.chunks[0]
        starts = _chunk_starts(dataset, chunk_rows * row_bytes)
    else:
        return None
    if starts is None or len(starts) != math.ceil(shape[0] / chunk_rows):  # an unallocated chunk: fill values
        return None
    runs: list[Run] = []
    for first, offset in sorted(starts):
        rows = min(chunk_rows, shape[0] - first)
        last = runs[-1] if runs else None
        if last and last.first + last.rows == first and last.offset + last.rows * row_bytes == offset:
            runs[-1] = Run(first=last.first, rows=last.rows + rows, offset=last.offset)
        else:
            runs.append(Run(first=first, rows=rows, offset=offset))
    return runs


def _chunk_starts(dataset: h5py.Dataset, chunk_bytes: int) -> list[tuple[int, int]] | None:
    """(first row, byte offset) of every allocated chunk, or None if one is filtered or sized oddly."""
    count = dataset.id.get_num_chunks()
    if count > MAX_CHUNKS:
        return None
    infos: list[Any] = []  # h5py's StoreInfo records
    if hasattr(dataset.id, "chunk_iter"):
        dataset.id.chunk_iter(infos.append)
    elif count <= MAX_INDEXED_CHUNKS:
        infos = [dataset.id.get_chunk_info(i) for i in range(count)]
    else:
        return None
    starts = []
    for info in infos:
        if info.filter_mask or info.size != chunk_bytes or info.byte_offset is None or any(info.chunk_offset[1:]):
            return None
        starts.append((int(info.chunk_offset[0]), int(info.byte_offset)))
    return starts
