"""A worker's gradient buffers -> gradient files: write into a kept map, publish by a hard link.

A fresh 40 MB file costs an allocation, ~10,000 page faults and, when deleted, freeing its pages: more
than writing the gradient itself. So each worker keeps a few buffer files mapped for its whole life
(``b-<pid>-NNN.npy`` in the exchange area) and publishes a gradient by giving its buffer a second name,
``g-v…-t…-a….npy`` (``os.link``: atomic, and it fails rather than replace an existing name). The server
deletes that name once the update is reduced; a buffer whose link count is back to 1 is read by nobody
and is rewritten in place. A crash mid-write leaves only the dead worker's unnamed buffer, never a
gradient file; the server removes a dead worker's buffers when it replaces it.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memtrain.errors import MemtrainError
from memtrain.faults import fault_point
from memtrain.files import allocate_npy, is_no_space, no_space_error
from memtrain.layout import gradient_buffer_name, gradient_buffer_prefix, tmp_owner_pid, tmp_sibling


@dataclass
class Buffer:
    path: Path
    fd: int
    array: np.ndarray

    @property
    def free(self) -> bool:
        """Nobody else has a name for it: its last gradient was reduced (or never published)."""
        return os.fstat(self.fd).st_nlink == 1


class GradientBuffers:
    """The buffers of one worker process; ``take`` a free one, fill it, ``publish`` it under a name."""

    def __init__(self, exchange: Path):
        self.exchange = exchange
        self.buffers: list[Buffer] = []

    def take(self, size: int, dtype: np.dtype) -> Buffer:
        for buffer in self.buffers:
            if buffer.free and buffer.array.shape == (size,) and buffer.array.dtype == dtype:
                _write_point(buffer.path, buffer.array.nbytes)
                return buffer
        buffer = self._create(size, np.dtype(dtype))
        self.buffers.append(buffer)
        return buffer

    def publish(self, buffer: Buffer, path: Path) -> None:
        """Give ``buffer`` the name ``path``: readers see the complete gradient or no file at all."""
        try:
            os.link(buffer.path, path)
        except OSError as exc:
            raise MemtrainError(f"cannot publish a gradient file: {exc.strerror or exc}", path=path) from exc

    def _create(self, size: int, dtype: np.dtype) -> Buffer:
        path = self.exchange / gradient_buffer_name(os.getpid(), len(self.buffers))
        tmp = tmp_sibling(path)
        offset = allocate_npy(tmp, (size,), dtype)
        os.replace(tmp, path)
        fd = os.open(path, os.O_RDWR)
        array = np.memmap(path, dtype=dtype, mode="r+", offset=offset, shape=(size,))
        return Buffer(path, fd, array)


def _write_point(path: Path, nbytes: int) -> None:
    """The fault hit of a gradient write, as for a fresh file, so fault tests count the same writes."""
    try:
        fault_point("write")
    except OSError as exc:
        if is_no_space(exc):
            raise no_space_error(path, nbytes) from exc
        raise


def remove_buffers(exchange: Path, owner_pid: int) -> None:
    """Delete a dead worker's buffers and its half-written files (gradient files linked to its buffers keep
    their data until the server deletes them: those of its accepted results are still to be reduced)."""
    prefix = gradient_buffer_prefix(owner_pid)
    with contextlib.suppress(OSError):
        for name in os.listdir(exchange):
            if name.startswith(prefix) or tmp_owner_pid(name) == owner_pid:
                with contextlib.suppress(OSError):
                    os.unlink(exchange / name)
