"""Slice owners -> the gradient tasks that need the whole new version: one mark per step slice.

In a fused round each worker first steps its slice of the parameters into the unpublished next weight
file, marks its slice done, and then computes its gradient at that file -- which it may only read once
every slice is written. The marks are one int64 per slice in an exchange file, written and read with
``pwrite``/``pread`` (a system call orders them after the slice's stores through the map). A mark holds
the step's sequence number, negated when the slice came out non-finite, so waiters learn that the new
version is void instead of computing a gradient at it. The server numbers steps from 1 and creates the
file zeroed, so a mark from an earlier step (or an earlier server) never reads as this one's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from memtrain.files import allocate_npy, check_npy

MARK = np.dtype("<i8")
SPIN_SECONDS = 0.002  # a peer's slice usually lands within this; after it, sleep instead of spinning
SLEEP_SECONDS = 0.0005


class PeerWaitExpired(Exception):
    """A peer's slice did not land within the wait limit (its worker is dead or hung)."""


def create_marks(path: Path, slices: int) -> None:
    allocate_npy(path, (slices,), MARK)


class StepMarks:
    """A worker's handle on the marks file (opened once, kept for the worker's life)."""

    def __init__(self, path: Path):
        self.offset = check_npy(path, dtype=MARK).offset
        self.fd = os.open(path, os.O_RDWR)

    def mark(self, slice_index: int, seq: int, finite: bool) -> None:
        value = np.array([seq if finite else -seq], dtype=MARK)
        os.pwrite(self.fd, value.tobytes(), self.offset + slice_index * MARK.itemsize)

    def wait(self, seq: int, slices: int, limit: float, alive: Callable[[], None]) -> bool:
        """Wait until every slice of step ``seq`` is marked; True if all came out finite.

        Raises PeerWaitExpired after ``limit`` seconds; calls ``alive()`` (which exits the process when
        the server is gone) about once a second while it waits.
        """
        started = checked = time.monotonic()
        while True:
            marks = np.frombuffer(os.pread(self.fd, slices * MARK.itemsize, self.offset), dtype=MARK)
            if (np.abs(marks) == seq).all():
                return bool((marks > 0).all())
            now = time.monotonic()
            if now - started > limit:
                raise PeerWaitExpired(f"step {seq}: slices {np.flatnonzero(np.abs(marks) != seq).tolist()} "
                                      f"not written after {limit:g} s")
            if now - checked > 1.0:
                alive()
                checked = now
            if now - started > SPIN_SECONDS:
                time.sleep(SLEEP_SECONDS)

    def close(self) -> None:
        os.close(self.fd)
