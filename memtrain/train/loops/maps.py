"""Paths of .npy files -> maps of them that a process keeps between tasks, one per file (inode) and mode.

Mapping a 40 MB file afresh costs ~10,000 page faults every time it is touched; a map that is kept is
free. Gradient buffers and weight files are recycled (rewritten in place once nothing reads them), so a
worker keeps meeting the same inodes under new names: the cache is keyed by inode, not by name, and a
hit costs one ``stat`` of the name (asked for several times per update in the rounds). A read-only map
of a file the process already maps for writing (a version it stepped, then evaluates) is a view of that
map. A map whose file was deleted is dropped by ``drop_deleted``, which a worker calls once per task, so
it never pins a deleted file's pages for long.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from pathlib import Path

import numpy as np

from memtrain.files import check_npy, open_fd

# Maps kept per process: weight versions read and written (~3 inodes, 2 modes), gradient buffers of one
# update, the block digests, and double-buffered optimizer state read and written (Adam: 2 slots x 2
# parities x 2 modes). Beyond this the least recently used is dropped (it is only a page-fault saving).
MAX_MAPS = 32


class MapCache:
    """``get(path, shape, dtype, mode)`` -> a map of ``path``, reused while the same inode is met again."""

    def __init__(self, capacity: int = MAX_MAPS):
        self.capacity = capacity
        self._maps: OrderedDict[tuple[int, int, str], tuple[int, np.ndarray, int]] = OrderedDict()  # fd, map, bytes

    def get(self, path: Path, shape: tuple[int, ...], dtype: np.dtype, mode: str = "r") -> np.ndarray:
        # A hit costs one stat: the cached descriptor holds its inode, so no other file can have taken
        # its number, and a name that points to that inode now is a name of the cached file.
        try:
            info = os.stat(path)
        except FileNotFoundError:
            info = None
        if info is not None:
            key = (info.st_dev, info.st_ino, mode)
            entry = self._maps.get(key)
            if entry is not None and entry[2] == info.st_size:
                self._maps.move_to_end(key)
                return entry[1]
            writable = self._maps.get((info.st_dev, info.st_ino, "r+"))
            if mode == "r" and writable is not None and writable[2] == info.st_size:
                # the same shared pages, read-only: a version a process wrote is read without a new map
                view = writable[1].view()
                view.flags.writeable = False
                self._put(key, os.dup(writable[0]), view, info.st_size)
                return view
        fd = open_fd(path, what="a .npy file", write=mode == "r+")
        try:
            info = os.fstat(fd)
            key = (info.st_dev, info.st_ino, mode)
            entry = self._maps.get(key)
            if entry is not None and entry[2] == info.st_size:
                self._maps.move_to_end(key)
                os.close(fd)
                return entry[1]
            header = check_npy(path, shape=shape, dtype=dtype)
            if header.nbytes == 0:
                os.close(fd)
                return np.zeros(header.shape, dtype=header.dtype)
            with os.fdopen(os.dup(fd), "r+b" if mode == "r+" else "rb") as handle:
                mapped = np.memmap(handle, dtype=header.dtype, mode=mode, offset=header.offset, shape=header.shape)
            array = mapped.view(np.ndarray)  # keeps the map alive; slicing a memmap runs Python code per slice
        except BaseException:
            os.close(fd)
            raise
        self._put(key, fd, array, info.st_size)
        return array

    def _put(self, key: tuple[int, int, str], fd: int, array: np.ndarray, size: int) -> None:
        old = self._maps.pop(key, None)
        if old is not None:
            os.close(old[0])
        self._maps[key] = (fd, array, size)
        while len(self._maps) > self.capacity:
            _, (dropped, _, _) = self._maps.popitem(last=False)
            os.close(dropped)

    def drop_deleted(self) -> None:
        for key in [k for k, (fd, _, _) in self._maps.items() if os.fstat(fd).st_nlink == 0]:
            os.close(self._maps.pop(key)[0])

    def close(self) -> None:
        """Drop every map (a long-lived process that is done with the run: a Dask worker)."""
        while self._maps:
            _, (fd, _, _) = self._maps.popitem()
            os.close(fd)
