"""A split's shard files -> one read-only array over all their rows, for a gather of one ``take``.

A batch of the row order holds rows of up to 64 shards (memtrain/order.py: one block of every stratum
per window), and a gather shard by shard costs two numpy calls per shard it touches (about 1.6 us a
pair: 150 us for a batch of 512 rows from 64 shards, against 51 us from 4). Here the shard files are
mapped side by side into one reserved range of address space, each placed so that its rows fall on
one common row stride: the rows of every shard are then rows of one array (with unmapped gaps between
shards that no index reaches), and a batch is one ``take`` whatever the number of shards.

Linux/POSIX only (``mmap`` with ``MAP_FIXED`` through ctypes); ``join`` returns None where that is not
available or the shards' headers cannot be placed on a common stride, and the caller gathers shard by
shard. The files are mapped read-only and the array is read-only: a write is refused by numpy.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memtrain.files import open_fd, read_npy_header

MAP_FAILED = ctypes.c_void_p(-1).value
MAP_FIXED, _MAP_NORESERVE, _PROT_NONE = 0x10, 0x4000, 0  # Linux values Python's mmap module lacks


@dataclass(frozen=True, kw_only=True)
class Joined:
    """``array[first[s] + i]`` is row i of shard s."""

    array: np.ndarray
    first: np.ndarray  # int64, one per shard


def libc() -> ctypes.CDLL | None:
    """The C library with ``mmap`` and ``munmap`` typed for ctypes; None where it cannot be loaded."""
    try:
        lib = ctypes.CDLL(None, use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.c_long)
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
        return lib
    except (OSError, AttributeError):
        return None


def place(offsets: list[int], sizes: list[int], row_bytes: int, page: int = mmap.PAGESIZE) -> list[int] | None:
    """Page-aligned places (from the start of the range) for files whose rows start at ``offsets`` and whose
    mapped lengths are ``sizes``, so that every file's first row lies a whole number of rows after the first
    file's; None when a header offset makes that impossible."""
    step = row_bytes // math.gcd(page, row_bytes)  # page moves before the residue repeats
    places, cursor = [], 0
    for offset, size in zip(offsets, sizes, strict=True):
        for k in range(step):
            at = cursor + k * page
            if (at + offset - offsets[0]) % row_bytes == 0:
                break
        else:
            return None
        places.append(at)
        cursor = at + -(-size // page) * page
    return places


def join(paths: list[Path], rows: list[int], row_shape: tuple[int, ...], dtype: np.dtype) -> Joined | None:
    """One read-only array over the rows of the .npy files ``paths`` (already validated by the caller)."""
    lib = libc()
    if lib is None or not paths or sys.platform != "linux":
        return None
    row_bytes = int(np.prod(row_shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if row_bytes == 0:
        return None
    offsets = [read_npy_header(path).offset for path in paths]
    sizes = [offset + n * row_bytes for offset, n in zip(offsets, rows, strict=True)]
    places = place(offsets, sizes, row_bytes)
    if places is None:
        return None
    total = places[-1] + -(-sizes[-1] // mmap.PAGESIZE) * mmap.PAGESIZE
    reserve = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
    base = lib.mmap(None, total, _PROT_NONE, reserve, -1, 0)
    if base in (None, MAP_FAILED):
        return None
    try:
        for path, at, size in zip(paths, places, sizes, strict=True):
            if size:
                _map_at(lib, base + at, size, path)
    except OSError:
        lib.munmap(base, total)
        return None
    start = base + offsets[0]
    length = (total - offsets[0]) // row_bytes
    buffer = (ctypes.c_char * (length * row_bytes)).from_address(start)
    weakref.finalize(buffer, lib.munmap, base, total)  # unmapped once no array over it is left
    array = np.frombuffer(buffer, dtype=np.dtype(dtype)).reshape(length, *row_shape)
    array.flags.writeable = False
    first = np.array([(at + offset - offsets[0]) // row_bytes for at, offset in zip(places, offsets, strict=True)],
                     dtype=np.int64)
    return Joined(array=array, first=first)


def _map_at(lib: ctypes.CDLL, address: int, size: int, path: Path) -> None:
    fd = open_fd(path, what="a dataset shard")
    try:
        got = lib.mmap(address, size, mmap.PROT_READ, mmap.MAP_SHARED | MAP_FIXED, fd, 0)
        if got != address:
            raise OSError(ctypes.get_errno(), f"mapping {path} in place failed")
    finally:
        os.close(fd)
