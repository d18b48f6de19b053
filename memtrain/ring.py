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

The counts are one process's: a fork copies the arrays (and their finalizers) without counting them, so
a child could read a slot the parent has let go of, once the worker rewrote it, and its finalizers would
free slots the parent still holds. So at every fork (``os.register_at_fork``) the child makes its map of
each ring private: the slots held at the fork are copied into anonymous memory at the same addresses
(the rest of the ring and its counts become the child's own), while the parent's releases wait on the
ring's lock until the child has copied. A batch is then the child's own copy, as a fork would give of any
other memory; the parent's rings are untouched. Nothing of this runs per batch; a fork with nothing held
costs a lock per ring.
"""

from __future__ import annotations

import mmap
import os
import secrets
import select
import tempfile
import threading
import weakref
from dataclasses import dataclass
from multiprocessing.reduction import DupFd
from typing import Any

import numpy as np

from memtrain.files import pid_alive
from memtrain.joined import MAP_FAILED, MAP_FIXED, libc

SLOTS = 4  # per worker: the DataLoader's default prefetch of 2 per worker, one batch held, one being made
HEADER = 64  # bytes before the first slot: one uint8 count per slot
ALIGN = 64
PINNED = 255  # a count that releases never bring to 0: the slot is never reused (a fork that could not copy)


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
        # x and y may be freed in two threads (the DataLoader's pin thread); reentrant, as a garbage collection
        # while a fork holds it (below) runs finalizers in the forking thread
        self.lock = threading.RLock()
        with _RECEIVED_LOCK:
            _RECEIVED.add(self)

    def release(self, slot: int) -> None:
        with self.lock:
            self.counts[slot] -= 1

    def held(self) -> list[int]:
        return np.flatnonzero(self.counts).tolist()

    def make_private(self, slots: list[int]) -> bool:
        """In a forked child: this map becomes anonymous memory holding the header and slots ``slots`` as they
        are (every array over it keeps its address); False where that cannot be done."""
        size, at = len(self.map), self.counts.ctypes.data
        starts = [HEADER + slot * self.layout.slot_bytes for slot in slots]
        kept = [(0, self.map[:HEADER])] + [(a, self.map[a:a + self.layout.slot_bytes]) for a in starts]
        lib = libc()
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_FIXED
        # Linux checks the limits before it replaces a mapping: a refused call leaves the shared one in place
        if lib is None or lib.mmap(at, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0) in (None, MAP_FAILED):
            return False
        for a, data in kept:
            self.map[a:a + len(data)] = data
        return True


_MAPPED: dict[str, _Mapped] = {}  # the rings of the workers this process receives from, by token
_RECEIVED: weakref.WeakSet[_Mapped] = weakref.WeakSet()  # every map alive here (a dead worker's too, while held)
_RECEIVED_LOCK = threading.Lock()  # a map added (in the pin thread, say) while a fork lists them
_RINGS: dict[Layout, Ring] = {}  # a loader worker's own rings, one per batch layout, kept for the process's life


def worker_ring(layout: Layout) -> Ring:
    """This process's ring for batches of ``layout`` (made on first use; a forked child makes its own)."""
    ring = _RINGS.get(layout)
    if ring is None:
        ring = _RINGS[layout] = Ring(layout)
    return ring


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


class _Fork:
    """One fork, seen from the thread that forks: the maps whose locks it holds, the slots held in each, and
    the pipe the child closes once it has copied them (``b"c"``: copied; end of file alone: it could not)."""

    local = threading.local()
    WAIT = 60.0  # seconds the parent waits for the child's copy (it takes milliseconds), then pins the slots

    @classmethod
    def before(cls) -> None:
        with _RECEIVED_LOCK:
            maps = list(_RECEIVED)
        for mapped in maps:
            mapped.lock.acquire()  # the parent frees nothing until the child has its copy
        held = [(mapped, slots) for mapped in maps if (slots := mapped.held())]
        try:
            pipe = os.pipe() if held else None
        except OSError:  # no descriptor left: the child's copy cannot be waited for, so never reuse these slots
            pipe = None
            cls.pin(held)
        cls.local.fork = (maps, held, pipe)

    @classmethod
    def in_parent(cls) -> None:
        maps, held, pipe = cls.local.__dict__.pop("fork", ([], [], None))
        try:
            if pipe is not None:
                os.close(pipe[1])
                try:
                    if not cls.copied(pipe[0]):  # not copied (or the child died, or the fork failed)
                        cls.pin(held)
                finally:
                    os.close(pipe[0])
        finally:
            for mapped in maps:
                mapped.lock.release()

    @classmethod
    def in_child(cls) -> None:
        maps, held, pipe = cls.local.__dict__.pop("fork", ([], [], None))
        _RINGS.clear()  # a worker's ring is its own: a forked child makes a new one
        _MAPPED.clear()  # nor does the child receive from its parent's workers
        for mapped in maps:
            mapped.lock = threading.RLock()
        try:
            copied = all([mapped.make_private(slots) for mapped, slots in held])
            if pipe is not None and copied:
                os.write(pipe[1], b"c")
        finally:
            if pipe is not None:
                os.close(pipe[0])
                os.close(pipe[1])

    @classmethod
    def copied(cls, fd: int) -> bool:
        """Whether the child said it copied (``b"c"``) within ``WAIT``. poll, not select: a process with many open
        files (a run's mapped buffers, a raised limit) has descriptors past select's 1024."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        return bool(poller.poll(cls.WAIT * 1000)) and os.read(fd, 1) == b"c"

    @staticmethod
    def pin(held: list[tuple[_Mapped, list[int]]]) -> None:
        """Slots no release frees again: their worker sends its batches torch's way once the rest are held."""
        for mapped, slots in held:
            mapped.counts[slots] = PINNED


os.register_at_fork(before=_Fork.before, after_in_parent=_Fork.in_parent, after_in_child=_Fork.in_child)
