"""A batch made in a ``DataLoader`` worker -> the process that iterates the loader, through shared slots.

torch hands a tensor from a worker to the main process by putting its storage in a new shared-memory
segment and passing that segment's file descriptor through ``multiprocessing``'s resource sharer: a
socket connection with an authentication handshake per tensor, two per (x, y) batch, about 0.4 ms each
in the receiving process (cProfile: ``rebuild_storage_fd``), more than the rows cost to gather. Here
each worker process owns one ``Ring``: a few batch-sized slots in one shared memory file, made once.
The worker gathers a batch straight into a free slot, and only a ``RingBatch`` (the ring's identity,
the slot and the row count; the ring's descriptor once, with the first batch) crosses the queue.
Unpickling it in the receiving process maps the ring once and turns the slot into tensors with no copy.

A slot is reused only when nothing refers to its rows any more: its count (in the ring's header) is
set to 2 by the worker and each of the two arrays the tensors are made from lowers it by one when it is
freed, that is once the tensors, and every view of them, are gone. A batch the user keeps is therefore
never overwritten; a worker that finds no free slot sends that batch the torch way instead. Private
memory does not grow: the slots are shared memory, bounded by ``SLOTS`` batches per worker.
"""

from __future__ import annotations

import mmap
import os
import secrets
import tempfile
import threading
import weakref
from dataclasses import dataclass
from multiprocessing.reduction import DupFd
from typing import Any

import numpy as np

from memtrain.files import pid_alive

SLOTS = 4  # per worker: the DataLoader's default prefetch of 2 per worker, one batch held, one being made
HEADER = 64  # bytes before the first slot: one uint8 count per slot
ALIGN = 64


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What a slot holds: up to ``rows`` rows of x and of y."""

    rows: int
    x_shape: tuple[int, ...]
    x_dtype: str
    y_shape: tuple[int, ...]
    y_dtype: str

    def part_bytes(self, shape: tuple[int, ...], dtype: str) -> int:
        size = self.rows * int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        return -(-size // ALIGN) * ALIGN

    @property
    def slot_bytes(self) -> int:
        return self.part_bytes(self.x_shape, self.x_dtype) + self.part_bytes(self.y_shape, self.y_dtype)

    def arrays(self, buffer: Any, slot: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Slot ``slot``'s first ``rows`` rows of x and y, as arrays over ``buffer`` (writable)."""
        at = HEADER + slot * self.slot_bytes
        x = _part(buffer, at, rows, self.x_shape, self.x_dtype)
        y = _part(buffer, at + self.part_bytes(self.x_shape, self.x_dtype), rows, self.y_shape, self.y_dtype)
        return x, y


def _part(buffer: Any, at: int, rows: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    count = rows * int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(buffer, np.dtype(dtype), count, at).reshape(rows, *shape)


def _shared_file(size: int) -> int:
    """A descriptor of ``size`` bytes of shared memory with no name (nothing to clean up if a process dies)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("memtrain-ring", os.MFD_CLOEXEC)
    else:  # pragma: no cover - not Linux
        with tempfile.TemporaryFile() as handle:
            fd = os.dup(handle.fileno())
    os.ftruncate(fd, size)
    return fd


class Ring:
    """A worker's slots (made in the worker, mapped by the receiver when the first batch arrives)."""

    def __init__(self, layout: Layout, slots: int = SLOTS) -> None:
        self.layout, self.slots = layout, slots
        self.token = f"{os.getpid()}-{secrets.token_hex(8)}"
        self._fd = _shared_file(HEADER + slots * layout.slot_bytes)
        self._map = mmap.mmap(self._fd, HEADER + slots * layout.slot_bytes)
        self._counts = np.frombuffer(self._map, np.uint8, slots)
        self._announced = False

    def take(self, rows: int) -> tuple[int, np.ndarray, np.ndarray] | None:
        """A free slot and its arrays for ``rows`` rows, now marked busy; None when every slot is held."""
        if rows > self.layout.rows:
            return None
        free = np.flatnonzero(self._counts == 0)
        if not len(free):
            return None
        slot = int(free[0])
        self._counts[slot] = 2  # x and y: each lowers it by one when the receiver frees it
        return (slot, *self.layout.arrays(self._map, slot, rows))

    def batch(self, slot: int, rows: int) -> RingBatch:
        """What crosses the queue for slot ``slot``: the descriptor only the first time."""
        fd = None if self._announced else DupFd(self._fd)
        self._announced = True
        return RingBatch(token=self.token, fd=fd, layout=self.layout, slots=self.slots, slot=slot, rows=rows)


@dataclass(frozen=True, kw_only=True)
class RingBatch:
    """A batch in a ring's slot; unpickled, it is the tuple of tensors ``(x, y)`` over the slot."""

    token: str
    fd: Any
    layout: Layout
    slots: int
    slot: int
    rows: int

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return _receive, (self.token, self.fd, self.layout, self.slots, self.slot, self.rows)


class _Mapped:
    """The receiver's map of one worker's ring."""

    def __init__(self, fd: int, layout: Layout, slots: int) -> None:
        self.layout = layout
        self.map = mmap.mmap(fd, HEADER + slots * layout.slot_bytes)
        self.counts = np.frombuffer(self.map, np.uint8, slots)
        self._lock = threading.Lock()  # x and y may be freed in two threads (the DataLoader's pin thread)

    def release(self, slot: int) -> None:
        with self._lock:
            self.counts[slot] -= 1


_MAPPED: dict[str, _Mapped] = {}  # the rings of the workers this process receives from, by token


def _receive(token: str, fd: Any, layout: Layout, slots: int, slot: int, rows: int) -> tuple[Any, Any]:
    import torch

    mapped = _MAPPED.get(token)
    if mapped is None:
        if fd is None:
            raise RuntimeError(f"a batch from loader ring {token} arrived before its ring")
        _forget_dead_workers()
        descriptor = fd.detach()
        try:
            mapped = _MAPPED[token] = _Mapped(descriptor, layout, slots)
        finally:
            os.close(descriptor)
    arrays = layout.arrays(mapped.map, slot, rows)
    for array in arrays:  # the slot is free again once both arrays (and so every tensor over them) are gone
        weakref.finalize(array, mapped.release, slot)
    return torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1])


def _forget_dead_workers() -> None:
    """Drop the maps of workers that have exited (their batches, still held, keep their own pages mapped)."""
    for token in [t for t in _MAPPED if not pid_alive(int(t.split("-")[0]))]:
        del _MAPPED[token]
