"""Async mode on one machine: the workers take tasks and apply groups themselves, at a shared desk.

Streamed (train/loops/overlap.py), every gradient of async mode goes through the server: a message out, an answer
back, the server's step. On one machine the workers can do without it, as the rounds do (train/loops/rounds.py),
and on a small model they must: there each gradient costs less than its trip through a third process
(docs/async.md, "Throughput with a straggler"). Each worker process runs ``DeskParticipant.run`` in a
stretch; the server starts the stretch, watches it and logs what the records say (``DeskLog``).

The **desk** (``async-desk.npy``) is a few int64 words every participant maps, changed only under an
``flock`` of the desk's file (``flock`` is released when its holder dies, so a killed worker never leaves
it held): the newest published version, the next task of the stretch's list (``async-tasks.npy``: the
epoch's tasks not applied yet, in plan order), the tasks to compute again, the gradients of the group
being filled, and what each participant is computing (its task and the version it reads: its claim).

One participant's loop:

1. **take** (under the lock): a task to compute again, else the list's next; claim it at the newest version;
2. **gradient**: compute it at that version into one of the participant's own buffers;
3. **post** (under the lock): drop the claim; a gradient more than ``max_staleness`` versions behind the
   version its group will step from goes back (its task is computed again, never applied); else it joins
   the group, in arrival
   order; the gradient that fills the group (``async_group``), or the epoch's last, hands the group to
   this participant with the next group number;
4. **step** group n once group n - 1 is published: add its gradients in arrival order, apply the
   optimizer over the whole vector into the next version's file, rename it into place (a rename that
   never replaces), then write the group's record (its status last) and, under the lock, make it the
   newest version and free its buffers.

A version is retired (recycled) by the stepper only when it is older than every claim and than the
newest ``run.keep_versions``: a claim is made under the lock at the newest version, so no participant
ever reads a version that is being rewritten. A published version is never written again.

Faults are the rounds' (train/server/scheduler.py ``run_stretch``): a death, a silence or a stop calls the stretch
off; the server logs the records published so far (a version renamed but not recorded is deleted and
made again) and starts the next stretch from the tasks not applied. A group being filled dies with its
stretch: its tasks are not applied, so they are computed again. Nothing is applied twice: a task is
applied when its group's record says so, and the next stretch's list leaves it out.

A participant answers DONE only once every task is applied, after which the others have nothing left to write: the
server ends the stretch at the first DONE (a worker stopped at the end of an epoch does not hold up the next one),
writing the end on the board before it makes the next stretch's files; a participant that finds its stretch ended
once its own files are open touches nothing (they may be the next stretch's, under the same names).
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from memtrain.faults import fault_point
from memtrain.files import DIGEST_BYTES, allocate_npy, open_fd, open_npy
from memtrain.train.exchange.area import DESK_BUFFER, DESK_RECORDS, DESK_TASKS, DESK_WORDS, discard
from memtrain.train.exchange.marks import GRADIENT, PUBLISHED, SKIPPED, STEP, WAITING, Cancelled
from memtrain.train.exchange.weights import weights_digest
from memtrain.train.loops.mapped import RoundFiles
from memtrain.train.messages import Outcome, Stretch
from memtrain.train.optim import learning_rate
from memtrain.train.plan import TaskRange, Update, async_updates_per_epoch, task_stream
from memtrain.train.records.logbook import Logbook
from memtrain.train.records.state import Position
from memtrain.train.schedule import Arrival, ArrivalState

# desk words
NEWEST, NEXT, GROUPS, HANDED, PENDING, REDO, DISCARDED, STOPPED, LEFT_FROM = range(9)
HEADER = 9
GROUP_WORDS = 4  # slot, buffer, task index, version
LOSS_WORDS = 2  # the loss and compute seconds of a pending gradient, as float64 bits
# A participant waiting for its group's turn or for a task looks again after 50 us, then after twice as long
# each time, up to 1 ms: a short wait (the usual one: a peer's step or gradient about to land) ends at once,
# and a long one costs no core.
WAIT_SECONDS, WAIT_MAX_SECONDS = 50e-6, 1e-3


def pause(waited: int) -> int:
    """Sleep before the next look (the ``waited``-th in a row); returns the count for the next one."""
    time.sleep(min(WAIT_SECONDS * 2 ** min(waited, 10), WAIT_MAX_SECONDS))
    return waited + 1


def buffers_per_slot(group: int) -> int:
    """A participant's gradient buffers: a group being stepped and one being filled may each hold ``group``
    of its gradients, and it computes one more meanwhile."""
    return 2 * group + 1


def desk_words(participants: int, group: int) -> int:
    return (HEADER + group * (GROUP_WORDS + LOSS_WORDS) + participants * 2 + participants
            + participants * buffers_per_slot(group))


def records_dtype(group: int) -> np.dtype:
    """One group's record: each gradient's task index (in the stretch's list), version, loss and compute time, in
    the order added; the version published, the learning rate, the stale gradients discarded while it filled."""
    return np.dtype([("index", "<i8", (group,)), ("at", "<i8", (group,)), ("loss", "<f8", (group,)),
                     ("seconds", "<f8", (group,)), ("count", "<i8"), ("discarded", "<i8"), ("version", "<i8"),
                     ("lr", "<f8"), ("time", "<f8"), ("checksum", "u1", (DIGEST_BYTES,)), ("status", "i1")])


class DeskFile:
    """The desk's words, mapped, and its lock (an ``flock`` of its file, by this process's own descriptor)."""

    def __init__(self, exchange: Path, participants: int, group: int):
        self.participants, self.group = participants, group
        path = DESK_WORDS.path(exchange)
        # a plain view of the map: indexing a memmap runs Python code on every access
        self.words = open_npy(path, shape=(desk_words(participants, group),), dtype=np.int64,
                              mode="r+").view(np.ndarray)
        self.fd = open_fd(path, what="the desk", write=True)  # never through a link
        at = HEADER
        self.pending = self.words[at:at + group * GROUP_WORDS].reshape(group, GROUP_WORDS)
        at += group * GROUP_WORDS
        self.pending_loss = self.words[at:at + group * LOSS_WORDS].view(np.float64).reshape(group, LOSS_WORDS)
        at += group * LOSS_WORDS
        self.claims = self.words[at:at + participants * 2].reshape(participants, 2)  # task index, version; -1: none
        at += participants * 2
        self.redo = self.words[at:at + participants]
        at += participants
        self.busy = self.words[at:].reshape(participants, buffers_per_slot(group))

    @contextlib.contextmanager
    def locked(self) -> Iterator[np.ndarray]:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield self.words
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        os.close(self.fd)


def create_desk(exchange: Path, size: int, participants: int, group: int, tasks: np.ndarray, version: int) -> None:
    """A stretch's desk, task list and records, fresh (the server, before sending the stretch); the gradient
    buffers are made once."""
    discard([DESK_WORDS.path(exchange), DESK_TASKS.path(exchange), DESK_RECORDS.path(exchange)])
    allocate_npy(DESK_WORDS.path(exchange), (desk_words(participants, group),), np.int64)
    desk = DeskFile(exchange, participants, group)
    desk.words[:] = 0
    desk.words[NEWEST] = version
    desk.words[LEFT_FROM] = -1  # the oldest version left on disk: not known yet (the first step lists them)
    desk.claims[:] = -1
    desk.close()
    allocate_npy(DESK_TASKS.path(exchange), tasks.shape, np.int64)
    open_npy(DESK_TASKS.path(exchange), shape=tasks.shape, dtype=np.int64, mode="r+")[:] = tasks
    allocate_npy(DESK_RECORDS.path(exchange), (max(1, len(tasks)),), records_dtype(group))
    for slot in range(participants):
        for buffer in range(buffers_per_slot(group)):
            path = DESK_BUFFER.path(exchange, slot, buffer)
            if not path.exists():
                allocate_npy(path, (size,), np.float32)


def open_desk_records(exchange: Path, group: int) -> np.ndarray:
    """The stretch's group records, mapped for reading and writing."""
    return open_npy(DESK_RECORDS.path(exchange), dtype=records_dtype(group), mode="r+").view(np.ndarray)


class DeskParticipant:
    """One worker's part in an async stretch: ``stretch.slot``, ``stretch.group`` gradients per group,
    ``stretch.first`` groups of ``stretch.epoch`` applied before it began (the learning rate counts groups)."""

    def __init__(self, files: RoundFiles, stretch: Stretch, *, alive: Callable[[], None]):
        self.files, self.stretch, self.slot, self.alive = files, stretch, stretch.slot, alive
        self.group = stretch.group
        self.arrival = Arrival(group=stretch.group, max_staleness=stretch.max_staleness)  # the schedule
        exchange = files.exchange
        self.desk = DeskFile(exchange, stretch.participants, self.group)
        self.tasks = open_npy(DESK_TASKS.path(exchange), dtype=np.int64)  # task numbers of the epoch's task stream
        self.records = open_desk_records(exchange, self.group)
        self.ranges = task_stream(files.plan.updates(stretch.epoch))
        self.per_epoch = async_updates_per_epoch(len(self.ranges), self.group)
        self.total_updates = self.per_epoch * files.setup.epochs
        self.buffers = [[files.maps.get(DESK_BUFFER.path(exchange, s, b), (files.size,), np.float32, "r+")
                         for b in range(buffers_per_slot(self.group))] for s in range(stretch.participants)]
        # Looked at once every file of the stretch is open: a stretch the server ended meanwhile without this
        # participant (another found every task applied: train/server/scheduler.py ``run_stretch``) is over, and
        # the files just opened may be the next stretch's (same names, made after the end was written): touch
        # nothing. Not ended yet: the end, and so the next stretch's files, came after these were opened.
        self.over = files.board.ended(stretch.generation)

    def run(self) -> Outcome:
        try:
            if self.over:
                return Outcome.DONE
            with np.errstate(all="ignore"):
                while (buffer := self.free_buffer()) is not None and (claim := self.take()) is not None:
                    index, at = claim
                    loss, seconds = self.gradient(index, at, self.buffers[self.slot][buffer])
                    handed = self.post(index, at, buffer, loss, seconds)
                    if handed is not None:
                        self.step(*handed)
                if self.desk.words[STOPPED]:
                    return Outcome.NONFINITE
                fault_point("desk_done")
                return Outcome.DONE
        except Cancelled:
            return Outcome.CANCELLED
        finally:
            self.desk.close()

    def check(self) -> None:
        if self.files.board.cancelled(self.stretch.generation):
            raise Cancelled
        if self.desk.words[STOPPED]:
            raise _Stopped

    # --- 1. take ---

    def wait_for(self, ready: Callable[[], bool]) -> None:
        """Look until ``ready()``, backing off (``pause``); a cancelled or stopped stretch ends the wait."""
        waited = 0
        while not ready():
            self.check()
            self.alive()
            waited = pause(waited)

    def free_buffer(self) -> int | None:
        """One of this participant's buffers that holds no gradient waiting to be stepped; waits for one (a
        step frees its group's) when every one does; None if the run stops meanwhile."""
        mine = self.desk.busy[self.slot]  # only this slot marks them busy
        try:
            self.wait_for(lambda: not mine.all())
        except _Stopped:
            return None
        return int(np.flatnonzero(mine == 0)[0])

    def take(self) -> tuple[int, int] | None:
        """The next task (its index in the list) and the newest version, claimed; None when none is left."""
        desk, waited = self.desk, 0
        while True:
            try:
                self.check()
            except _Stopped:
                return None
            with desk.locked() as words:
                if words[REDO]:
                    words[REDO] -= 1
                    index = int(desk.redo[words[REDO]])
                elif words[NEXT] < len(self.tasks):
                    index = int(words[NEXT])
                    words[NEXT] += 1
                elif (desk.claims[:, 0] < 0).all() and words[GROUPS] == words[HANDED] and not words[PENDING]:
                    return None  # every task applied (or skipped)
                else:
                    index = -1  # others are computing: a stale gradient of theirs may come back
                if index >= 0:
                    at = int(words[NEWEST])
                    desk.claims[self.slot] = (index, at)
                    return index, at
            self.files.board.doing(self.slot, self.stretch.generation, WAITING, self.update_index(0))
            self.alive()
            waited = pause(waited)

    # --- 2. gradient ---

    def gradient(self, index: int, at: int, out: np.ndarray) -> tuple[float, float]:
        files = self.files
        task = int(self.tasks[index])
        rows = self.ranges[task]
        files.board.doing(self.slot, self.stretch.generation, GRADIENT, self.update_index(0), task)
        x, y = files.rows(self.stretch.epoch, rows)
        weights = files.weights(at)
        loss, seconds = files.gradient(weights, files.views(weights), x, y, files.views(out), version=at, task=task)
        fault_point("after_grad_write")
        return loss, seconds

    # --- 3. post ---

    def post(self, index: int, at: int, buffer: int, loss: float,
             seconds: float) -> tuple[int, list[tuple[int, int]]] | None:
        """Into the group (or back, if stale); (group number, its buffers in the order added) when this one hands
        a group over (its record then holds the rest)."""
        desk = self.desk
        with desk.locked() as words:
            desk.claims[self.slot] = (-1, -1)
            # the version this gradient's group will step from, at most (the group being filled is the next
            # one handed over)
            if self.arrival.stale(Arrival.base(words[NEWEST], words[HANDED], words[GROUPS]), at):
                desk.redo[words[REDO]] = index
                words[REDO] += 1
                words[DISCARDED] += 1
                return None
            n = int(words[PENDING])
            desk.pending[n] = (self.slot, buffer, index, at)
            desk.pending_loss[n] = (loss, seconds)
            desk.busy[self.slot, buffer] = 1
            last = (words[NEXT] >= len(self.tasks) and not words[REDO] and (desk.claims[:, 0] < 0).all())
            if not self.arrival.full(n + 1, last):
                words[PENDING] = n + 1
                return None
            number = int(words[HANDED])
            record = self.records[number]
            record["count"] = n + 1
            record["index"][:n + 1] = desk.pending[:n + 1, 2]
            record["at"][:n + 1] = desk.pending[:n + 1, 3]
            record["loss"][:n + 1] = desk.pending_loss[:n + 1, 0]
            record["seconds"][:n + 1] = desk.pending_loss[:n + 1, 1]
            record["discarded"] = words[DISCARDED]
            handed = [(int(s), int(b)) for s, b in desk.pending[:n + 1, :2]]
            words[PENDING] = 0
            words[DISCARDED] = 0
            words[HANDED] += 1
            return number, handed

    # --- 4. step ---

    def step(self, number: int, handed: list[tuple[int, int]]) -> None:
        """Group ``number`` (its gradients in ``handed`` buffers): once the groups before it are published, step
        the newest version with it into the next and publish it; record it."""
        files, desk, count = self.files, self.desk, len(handed)
        self.wait_for(lambda: int(desk.words[GROUPS]) == number)  # the group before it is still stepping
        record = self.records[number]
        version = int(desk.words[NEWEST])
        update = self.update_index(number)
        files.board.doing(self.slot, self.stretch.generation, STEP, update)
        lr = learning_rate(files.optimizer, update, self.total_updates)
        grads = [self.buffers[s][b] for s, b in handed]
        rows = sum(self.ranges[int(self.tasks[i])].hi - self.ranges[int(self.tasks[i])].lo
                   for i in record["index"][:count])
        finite = (all(math.isfinite(loss) for loss in record["loss"][:count])
                  and self.step_into(version, grads, rows, lr))
        record["version"], record["lr"], record["time"] = version + 1 if finite else version, lr, time.time()
        if finite:
            digest = weights_digest(files.digests[(version + 1) % 2], files.size)
            record["checksum"] = np.frombuffer(digest, np.uint8)
        stop = not finite and files.setup.on_nonfinite == "stop"
        record["status"] = PUBLISHED if finite else SKIPPED
        with desk.locked() as words:
            for s, b in handed:
                desk.busy[s, b] = 0
            if finite:
                words[NEWEST] = version + 1
            words[GROUPS] += 1
            if stop:
                words[STOPPED] = 1

    def step_into(self, version: int, grads: list[np.ndarray], rows: int, lr: float) -> bool:
        """``version`` + the step of ``grads``' mean -> version + 1, published (RoundFiles.step_and_publish); False
        (nothing published) if it came out non-finite. The oldest version read is the oldest claim's."""
        files, desk = self.files, self.desk
        with desk.locked():
            claimed = [int(v) for task, v in desk.claims if task >= 0]
        left_from = int(desk.words[LEFT_FROM])  # steps run one at a time: only the stepper changes it
        finite, left = files.step_and_publish(version, grads, rows, lr, oldest=min(claimed, default=version),
                                              left_from=None if left_from < 0 else left_from)
        desk.words[LEFT_FROM] = max(left, -1)  # -1: not known yet
        return finite

    def update_index(self, number: int) -> int:
        """The run's update count of the stretch's group ``number``."""
        return self.stretch.epoch * self.per_epoch + self.stretch.first + number


class _Stopped(Exception):
    """A group came out non-finite and the job says to stop: the participants end."""


class DeskLog:
    """The server's side of a stretch at the desk: its records, logged in group order as they are finished."""

    def __init__(self, exchange: Path, group: int, tasks: np.ndarray, ranges: tuple[TaskRange, ...],
                 per_epoch: int):
        self.records = open_desk_records(exchange, group)
        self.tasks, self.ranges, self.per_epoch = tasks, ranges, per_epoch
        self.logged = 0

    def catch_up(self, position: Position, logbook: Logbook) -> None:
        """Log every group finished since the last call (a record is trusted by its status, written last)."""
        while self.logged < len(self.records) and self.records[self.logged]["status"] != 0:
            record = self.records[self.logged]
            count = int(record["count"])
            ids = [int(self.tasks[i]) for i in record["index"][:count]]
            update = Update(position.epoch, position.batch, position.update_index(self.per_epoch),
                            tuple(TaskRange(i, self.ranges[t].lo, self.ranges[t].hi) for i, t in enumerate(ids)))
            losses = record["loss"][:count].tolist()
            published = bool(record["status"] == PUBLISHED)
            logbook.applied(position, update, losses, version=int(record["version"]) if published else None,
                            at=record["at"][:count].tolist(),
                            checksum="xxh3-128-blocks:" + bytes(record["checksum"]).hex() if published else "",
                            compute=float(record["seconds"][:count].max()),
                            bad=[rows for rows, loss in zip(update.tasks, losses, strict=True)
                                 if not math.isfinite(loss)],
                            when=float(record["time"]), lr=float(record["lr"]), ids=ids,
                            discarded=int(record["discarded"]))
            state = position.schedule  # the desk runs async mode: Arrival's state
            assert isinstance(state, ArrivalState)
            state.add(ids)
            self.logged += 1
