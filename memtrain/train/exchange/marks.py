"""Participants of a round -> each other and the server: the marks they meet at, and what each update did.

A stretch of rounds runs without the server in the path. The participants meet at marks on a small
board, a file of int64 words in the exchange area (``round-board.npy``). Every participant marks every
meeting, whether or not it had work there:

- a **gradients mark** per slot: written once the slot's tasks of an update are in their buffers (and
  their losses in the update's record); negative if one of them had a non-finite loss;
- a **step mark** per slot: written once the slot's slice of the next weight version (and of the
  optimizer state, and the slice's block digests) is written; negative if the slice is not finite;
- the **ready mark**: written by the readier (the last slot; slot 0 when it is alone) once the file
  of the next version is there, so the next step can write it;
- the **cancel word**: written by the server to call a stretch off (a fault, a stop signal); every wait
  watches it;
- the **ledger**: the last update finished (published or skipped) and the version after it, written by
  the publisher after each update; where the next stretch starts after a fault;
- an **activity** per slot: what it is doing since when, so the server can name a dead or silent
  participant's work and time it out without a message per update.

A mark holds ``generation << 32 | (update + 1)``, negated when the piece came out non-finite, so a mark
from an older stretch, or from an earlier update, never counts for this one. No participant can be
more than one meeting ahead of another (every meeting needs everyone's mark), so the marks are kept in
two banks (update parity): a skipped update has no step meeting in between, and with fixed staleness
the step marks of an update are waited for at the next update's meeting, one bank behind. The ready
mark only grows: a waiter accepts a later one. Marks are written with ``pwrite`` and read with
``pread``: the system call orders them after the data they stand for, which was written through a map.
A waiter that finds its marks missing sleeps on the board's doorbell, which every mark rings
(train/exchange/doorbell.py).

Each update's record (``round-records.npy``, one row per update of the current epoch) holds each task's
loss and compute time, written by the task's owner before its mark, and how the update ended, written
by the publisher before the ledger: the server reads records only up to the ledger.

When the server runs the rounds itself (``train.workers = 0``) the board lives in memory: the marks
are the same, the waits never wait.
"""

from __future__ import annotations

import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from memtrain.files import DIGEST_BYTES, allocate_npy, check_npy, open_fd, open_npy
from memtrain.train.exchange.doorbell import Doorbell

WORD = np.dtype("<i8")
# A waiter looks at the marks this long before it sleeps on the doorbell (train/exchange/doorbell.py): on an idle
# machine the peer's mark often lands within it, and the wake-up of a sleeper costs about as much.
SPIN_SECONDS = 200e-6
ALIVE_EVERY = 1.0  # seconds between the waiter's checks that its server is still there

# The board's header words, by index: the cancel word, the ledger (three words: generation, update,
# version), the ready mark, the newest stretch ended without all its participants (``end``), the doorbell
# (train/exchange/doorbell.py), then ACTIVITY_WORDS per slot
CANCEL, LEDGER, READY_MARK, ENDED, DOORBELL, ACTIVITIES = 0, 1, 4, 5, 6, 8
ACTIVITY_WORDS = 5  # generation, kind, update, item, started (ns of CLOCK_MONOTONIC)

# Activity kinds (a slot's activity word ``kind``)
WAITING, GRADIENT, STEP, PUBLISH, READYING = 0, 1, 2, 3, 4

# Record status
PENDING, PUBLISHED, SKIPPED = 0, 1, 2

# Record ``bad`` flags, per task
LOSS_NONFINITE, GRADIENT_NONFINITE = 1, 2


class Cancelled(Exception):
    """The server called the stretch off."""


def mark_value(generation: int, update: int) -> int:
    return (generation << 32) | (update + 1)


@dataclass(frozen=True)
class Ledger:
    generation: int
    update: int  # the last update finished (published or skipped); -1 before the first
    version: int  # the newest version after it


@dataclass(frozen=True)
class Activity:
    slot: int
    generation: int
    kind: int
    update: int
    item: int  # the task (GRADIENT) or slice (STEP)
    started: float  # time.monotonic() when it began


class Board:
    """The board of a run with ``slots`` participants at most."""

    def __init__(self, slots: int, path: Path | None = None):
        self.slots = slots
        self.grad_words = ACTIVITIES + ACTIVITY_WORDS * slots
        self.step_words = self.grad_words + 2 * slots
        self.size = self.step_words + 2 * slots
        self.path = path
        if path is None:
            self._memory = [0] * self.size
        else:
            self._offset = check_npy(path, shape=(self.size,), dtype=WORD).offset
            self._fd = open_fd(path, what="the board", write=True)  # never through a link
            self._format = f"<{self.size}q"
            self._bell = Doorbell(self._fd, self._offset + DOORBELL * WORD.itemsize)

    @classmethod
    def create(cls, path: Path, slots: int) -> Board:
        allocate_npy(path, (cls(slots).size,), WORD)
        return cls(slots, path)

    # --- words ---

    def _read(self) -> list[int]:
        """Every word, as Python ints: a board is a few dozen words, read on every wait, where numpy's
        per-call cost would be most of the time."""
        if self.path is None:
            return self._memory
        return list(struct.unpack(self._format, os.pread(self._fd, self.size * WORD.itemsize, self._offset)))

    def _write(self, index: int, *values: int, ring: bool = True) -> None:
        if self.path is None:
            self._memory[index:index + len(values)] = values
            return
        os.pwrite(self._fd, struct.pack(f"<{len(values)}q", *values), self._offset + index * WORD.itemsize)
        if ring:
            self._bell.ring()

    # --- marks ---

    def mark_gradients(self, generation: int, update: int, slot: int, finite: bool) -> None:
        value = mark_value(generation, update)
        self._write(self._marks(self.grad_words, update, slot + 1).stop - 1, value if finite else -value)

    def mark_step(self, generation: int, update: int, slot: int, finite: bool) -> None:
        value = mark_value(generation, update)
        self._write(self._marks(self.step_words, update, slot + 1).stop - 1, value if finite else -value)

    def mark_ready(self, generation: int, update: int) -> None:
        self._write(READY_MARK, mark_value(generation, update))

    def wait_gradients(self, generation: int, update: int, participants: int, alive: Callable[[], None]) -> bool:
        """Wait for every participant's gradients mark of ``update`` and for the ready mark; True if all finite."""
        value, marks = mark_value(generation, update), self._marks(self.grad_words, update, participants)
        words = self._wait(generation, alive,
                           lambda w: w[READY_MARK] >= value and all(abs(m) == value for m in w[marks]))
        return all(m > 0 for m in words[marks])

    def wait_step(self, generation: int, update: int, participants: int, alive: Callable[[], None]) -> bool:
        """Wait for every participant's step mark of ``update``; True if every slice is finite."""
        value, marks = mark_value(generation, update), self._marks(self.step_words, update, participants)
        words = self._wait(generation, alive, lambda w: all(abs(m) == value for m in w[marks]))
        return all(m > 0 for m in words[marks])

    def wait_both(self, generation: int, *, step: int, grads: int, participants: int,
                  alive: Callable[[], None]) -> tuple[bool, bool]:
        """One meeting for fixed staleness: every step mark of update ``step`` and every gradients mark of
        update ``grads`` (and the ready mark); whether the step's slices, and the gradients, are all finite."""
        step_value, steps = mark_value(generation, step), self._marks(self.step_words, step, participants)
        grads_value, marks = mark_value(generation, grads), self._marks(self.grad_words, grads, participants)
        words = self._wait(generation, alive, lambda w: w[READY_MARK] >= grads_value
                           and all(abs(m) == grads_value for m in w[marks])
                           and all(abs(m) == step_value for m in w[steps]))
        return all(m > 0 for m in words[steps]), all(m > 0 for m in words[marks])

    def _marks(self, words: int, update: int, participants: int) -> slice:
        """The first ``participants`` marks of ``update``'s bank (update parity) of the kind at ``words``."""
        start = words + (update % 2) * self.slots
        return slice(start, start + participants)

    def _wait(self, generation: int, alive: Callable[[], None], ready: Callable[[list[int]], bool]) -> list[int]:
        started = checked = time.monotonic()
        while True:
            rung = self._bell.value if self.path is not None else 0
            words = self._read()
            if ready(words):
                return words
            if words[CANCEL] == generation:
                raise Cancelled
            if self.path is None:
                raise AssertionError("a lone participant waits for a mark only it can write")
            now = time.monotonic()
            if now - checked > ALIVE_EVERY:
                alive()
                checked = now
            if now - started > SPIN_SECONDS:
                self._bell.sleep(rung, ALIVE_EVERY)

    # --- the server's words ---

    def cancel(self, generation: int) -> None:
        self._write(CANCEL, generation)

    def cancelled(self, generation: int) -> bool:
        return self._read()[CANCEL] == generation

    def end(self, generation: int) -> None:
        """Stretch ``generation`` is over although some participants have not answered (a desk stretch, every
        task applied: train/server/scheduler.py ``run_stretch``). Written before the next stretch's files are made."""
        self._write(ENDED, generation, ring=False)

    def ended(self, generation: int) -> bool:
        """Whether stretch ``generation`` (or a later one) was ended without waiting for all its participants."""
        return self._read()[ENDED] >= generation

    def set_ledger(self, ledger: Ledger) -> None:
        self._write(LEDGER, ledger.generation, ledger.update, ledger.version, ring=False)

    def ledger(self) -> Ledger:
        words = self._read()
        return Ledger(words[LEDGER], words[LEDGER + 1], words[LEDGER + 2])

    def doing(self, slot: int, generation: int, kind: int, update: int, item: int = 0) -> None:
        self._write(ACTIVITIES + slot * ACTIVITY_WORDS, generation, kind, update, item, time.monotonic_ns(),
                    ring=False)

    def activities(self, generation: int) -> list[Activity]:
        """What each slot of stretch ``generation`` is doing (slots that have not started it are left out)."""
        words, found = self._read(), []
        for slot in range(self.slots):
            g, kind, update, item, started = words[ACTIVITIES + slot * ACTIVITY_WORDS:][:ACTIVITY_WORDS]
            if g == generation:
                found.append(Activity(slot, g, kind, update, item, started / 1e9))
        return found

    def close(self) -> None:
        if self.path is not None:
            self._bell.close()
            os.close(self._fd)


def records_dtype(tasks: int) -> np.dtype:
    """One update's record. ``loss`` and ``seconds`` per task; ``participants`` is how many shared its tasks
    (slots, or the server's task threads); ``version`` the version it published, ``at`` the one its
    gradients were computed at."""
    return np.dtype([("loss", "<f8", (tasks,)), ("seconds", "<f8", (tasks,)), ("bad", "u1", (tasks,)),
                     ("status", "i1"), ("participants", "<i2"), ("version", "<i8"), ("at", "<i8"), ("time", "<f8"),
                     ("checksum", "u1", (DIGEST_BYTES,))])


class UpdateRecord(NamedTuple):
    """One update's record as Python values (``read_records``), its fields those of ``records_dtype``, in order."""

    loss: list[float]  # per task
    seconds: list[float]  # per task
    bad: list[int]  # per task
    status: int
    participants: int
    version: int
    at: int
    time: float
    checksum: bytes


def read_records(rows: np.ndarray) -> list[UpdateRecord]:
    """Consecutive ``rows`` of the records (``records_dtype``) as Python values, converted a column at a time: the
    logbook reads every field of every update it logs, in groups, and a structured row costs about a microsecond a
    field read by name, or four new arrays (its per-task fields and its checksum) converted whole."""
    columns = [rows[name].tolist() for name in rows.dtype.names[:-1]]
    digests = rows["checksum"].tobytes()
    width = rows.dtype["checksum"].itemsize
    return [UpdateRecord(*fields, digests[i * width:(i + 1) * width])
            for i, fields in enumerate(zip(*columns, strict=True))]


def create_records(path: Path, updates: int, tasks: int) -> None:
    allocate_npy(path, (updates,), records_dtype(tasks))


def open_records(path: Path, updates: int, tasks: int) -> np.ndarray:
    """The records of the current epoch, mapped for reading and writing (every participant writes its part)."""
    mapped = open_npy(path, shape=(updates,), dtype=records_dtype(tasks), mode="r+")  # never through a link
    return mapped.view(np.ndarray)  # keeps the map alive; indexing a memmap runs Python code on every access
