"""Rows of one split, piece by piece -> fixed-size ``.npy`` shard pairs, each hashed while it is written.

Shard k of a split holds rows [k * rows_per_shard, ...) of that split, so every shard's size is known
before it is opened: each file is reserved at full size (a full disk fails cleanly, never SIGBUS), filled
through a map and published by rename (``files.writing_npy``). The checksum is the xxh3-128 of the
header bytes followed by the row bytes in write order, which is the hash of the file. Shards already
finished by an interrupted run (``finished``) are skipped: their rows are consumed but not written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import xxhash

from memtrain.faults import fault_point
from memtrain.files import CHECKSUM_ALGO, npy_header_bytes, writing_npy
from memtrain.layout import shard_name

ShardEntry = dict[str, Any]


@dataclass(frozen=True)
class SplitSpec:
    name: str
    rows: int
    rows_per_shard: int
    x_shape: tuple[int, ...]
    x_dtype: np.dtype
    y_shape: tuple[int, ...]
    y_dtype: np.dtype

    def shard_sizes(self) -> list[int]:
        full, rest = divmod(self.rows, self.rows_per_shard)
        return [self.rows_per_shard] * full + ([rest] if rest else [])


class _Part:
    """One open shard file (x or y): its map, its running hash and its fill level."""

    def __init__(self, stack: contextlib.ExitStack, path: Path, shape: tuple[int, ...], dtype: np.dtype):
        self.map = stack.enter_context(writing_npy(path, shape, dtype, durable=True))
        self.dtype = dtype
        header = npy_header_bytes(shape, dtype)
        self.bytes = len(header) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.hash = xxhash.xxh3_128(header)

    def write(self, at: int, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=self.dtype).reshape(-1, *self.map.shape[1:])
        self.map[at:at + len(rows)] = rows
        self.hash.update(rows.data)

    def checksum(self) -> str:
        return f"{CHECKSUM_ALGO}:{self.hash.hexdigest()}"


class ShardWriter:
    """Context manager: ``push(x, y)`` any number of times; ``entries`` lists the finished shards."""

    def __init__(self, root: Path, spec: SplitSpec, finished: dict[int, ShardEntry],
                 on_done: Callable[[str, int, ShardEntry], None]):
        self.root = root
        self.spec = spec
        self.sizes = spec.shard_sizes()
        self.finished = finished
        self.on_done = on_done
        self.entries: list[ShardEntry] = []
        self._stack: contextlib.ExitStack | None = None
        self._parts: tuple[_Part, _Part] | None = None
        self._filled = 0
        (root / spec.name).mkdir(parents=True, exist_ok=True)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._stack is not None:  # an error mid-shard: the open files are unlinked, never published
            stack, self._stack = self._stack, None
            stack.__exit__(kind, exc, tb)
        if kind is None and len(self.entries) != len(self.sizes):
            raise AssertionError(f"{self.spec.name}: wrote {len(self.entries)} of {len(self.sizes)} shards")

    def push(self, x: np.ndarray, y: np.ndarray) -> None:
        at = 0
        while at < len(x):
            index = len(self.entries)
            size = self.sizes[index]
            take = min(len(x) - at, size - self._filled)
            if index not in self.finished:
                self._write(index, self._filled, x[at:at + take], y[at:at + take])
            self._filled += take
            at += take
            if self._filled == size:
                self._close(index)

    def _write(self, index: int, filled: int, x: np.ndarray, y: np.ndarray) -> None:
        if self._parts is None:
            size = self.sizes[index]
            self._stack = contextlib.ExitStack()
            self._parts = (
                _Part(self._stack, self.root / shard_name(self.spec.name, "x", index), (size, *self.spec.x_shape),
                      self.spec.x_dtype),
                _Part(self._stack, self.root / shard_name(self.spec.name, "y", index), (size, *self.spec.y_shape),
                      self.spec.y_dtype))
        self._parts[0].write(filled, x)
        self._parts[1].write(filled, y)
        fault_point("prepare_mid_shard")

    def _close(self, index: int) -> None:
        self._filled = 0
        if index in self.finished:
            self.entries.append(self.finished[index])
            return
        assert self._stack is not None and self._parts is not None
        stack, self._stack = self._stack, None
        stack.close()  # flush, fsync, rename into place
        x_part, y_part = self._parts
        self._parts = None
        entry = {"rows": self.sizes[index], "x": shard_name(self.spec.name, "x", index),
                 "y": shard_name(self.spec.name, "y", index), "x_bytes": x_part.bytes, "y_bytes": y_part.bytes,
                 "x_checksum": x_part.checksum(), "y_checksum": y_part.checksum()}
        self.entries.append(entry)
        self.on_done(self.spec.name, index, entry)
        fault_point("prepare_after_shard")
