"""Rows of one split, piece by piece -> fixed-size ``.npy`` shard pairs, each hashed while it is written.

Shard k of a split holds rows [k * rows_per_shard, ...) of that split, so every shard's size is known
before it is opened: each file is reserved at full size (a full disk fails cleanly), filled with
``pwrite`` and published by rename (``files.writing_npy_rows``). The checksum is the xxh3-128 of the
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
from memtrain.files import CHECKSUM_ALGO, npy_header_bytes, writing_npy_rows
from memtrain.layout import shard_name
from memtrain.prepare.background import BackgroundJobs
from memtrain.records import SHARD, make

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
    """One open shard file (x or y) and its running hash (updated by the caller, in write order)."""

    def __init__(self, stack: contextlib.ExitStack, path: Path, shape: tuple[int, ...], dtype: np.dtype):
        self.file = stack.enter_context(writing_npy_rows(path, shape, dtype, durable=True))
        self.dtype = dtype
        header = npy_header_bytes(shape, dtype)
        self.bytes = len(header) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        self.hash = xxhash.xxh3_128(header)

    def rows(self, rows: np.ndarray) -> np.ndarray:
        """``rows`` as this file stores them, hashed: what ``file.write`` is then given."""
        rows = np.ascontiguousarray(rows, dtype=self.dtype).reshape(-1, *self.file.shape[1:])
        self.hash.update(rows.data)
        return rows

    def checksum(self) -> str:
        return f"{CHECKSUM_ALGO}:{self.hash.hexdigest()}"


class ShardWriter:
    """Context manager: ``push(x, y)`` any number of times; ``entries`` lists the finished shards.

    The caller's thread converts and hashes the rows; a background thread (``BackgroundJobs``) writes them,
    and a second one publishes each finished shard (fsync, rename, ``on_done``), in order, so that waiting
    for the disk holds up neither the writes of the next shard nor the caller. ``entries`` is complete once
    the ``with`` block has ended without an error.
    """

    def __init__(self, root: Path, spec: SplitSpec, finished: dict[int, ShardEntry],
                 on_done: Callable[[str, int, ShardEntry], None]):
        self.root = root
        self.spec = spec
        self.sizes = spec.shard_sizes()
        self.finished = finished
        self.on_done = on_done
        self.entries: list[ShardEntry] = []
        self._index = 0  # the shard being filled
        self._filled = 0
        self._parts: tuple[_Part, _Part] | None = None
        self._open: list[contextlib.ExitStack] = []  # shards not published yet (the writer removes them)
        (root / spec.name).mkdir(parents=True, exist_ok=True)
        self._writer = BackgroundJobs(0)  # one piece written while the next is queued: two pieces of memory
        self._publisher = BackgroundJobs(0)  # fsync and rename of finished shards (no rows held)

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        failure = exc
        if kind is None:
            try:
                self._writer.drain()
                self._publisher.drain()
            except BaseException as error:  # raised below, once the unpublished files are removed
                failure = error
        self._writer.stop(cancel=failure is not None)
        self._publisher.stop(cancel=failure is not None)
        for stack in reversed(self._open):  # an error mid-shard: the open files are unlinked, never published
            try:
                stack.__exit__(type(failure), failure, failure.__traceback__ if failure else None)
            except BaseException as error:  # e.g. ENOSPC becomes DiskFullError here
                failure = error
        self._open.clear()
        if failure is not None and failure is not exc:
            raise failure
        if kind is None and len(self.entries) != len(self.sizes):
            raise AssertionError(f"{self.spec.name}: wrote {len(self.entries)} of {len(self.sizes)} shards")

    def push(self, x: np.ndarray, y: np.ndarray) -> None:
        at = 0
        while at < len(x):
            index = self._index
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
            stack = contextlib.ExitStack()
            self._open.append(stack)
            self._parts = (
                _Part(stack, self.root / shard_name(self.spec.name, "x", index), (size, *self.spec.x_shape),
                      self.spec.x_dtype),
                _Part(stack, self.root / shard_name(self.spec.name, "y", index), (size, *self.spec.y_shape),
                      self.spec.y_dtype))
        (x_part, y_part), x_rows, y_rows = self._parts, self._parts[0].rows(x), self._parts[1].rows(y)

        def write() -> None:
            x_part.file.write(filled, x_rows)
            y_part.file.write(filled, y_rows)
            fault_point("prepare_mid_shard")

        self._writer.submit(write, x_rows.nbytes + y_rows.nbytes)

    def _close(self, index: int) -> None:
        self._filled = 0
        self._index += 1
        if index in self.finished:
            entry = self.finished[index]
            self._writer.submit(lambda: self._publisher.submit(lambda: self.entries.append(entry)))
            return
        assert self._parts is not None
        x_part, y_part = self._parts
        self._parts = None
        entry = make(SHARD, rows=self.sizes[index], x=shard_name(self.spec.name, "x", index),
                     y=shard_name(self.spec.name, "y", index), x_bytes=x_part.bytes, y_bytes=y_part.bytes,
                     x_checksum=x_part.checksum(), y_checksum=y_part.checksum())
        stack = self._open[-1]

        def publish() -> None:
            self._open.remove(stack)
            stack.close()  # fsync, rename into place
            self.entries.append(entry)
            self.on_done(self.spec.name, index, entry)

        self._writer.submit(lambda: self._publisher.submit(publish))  # once its rows are written
