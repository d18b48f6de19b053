"""Gradient tasks streamed to workers, the step in the server: the round when its participants cannot meet.

The round (train/rounds.py) has every participant meet at marks in a shared file. Workers on other
machines cannot: a network filesystem gives close-to-open consistency, not a coherent shared map. So
on a cluster the server runs the round's loop alone (one participant, the in-memory board) and only
the gradients leave it, as messages:

1. **step**: the server steps the whole parameter vector (train/reduce.py: the same sums in the same
   task order, the same optimizer) from the gradient files of the update; while the next update's
   tasks compute, it renames them to spares (``g-sU-tT-aA.npy``) and readies the next version's file;
2. **publish** the new version (a rename that never replaces), synced where the filesystem needs it,
   *before* any message names it: a file is read on another machine only after its writer closed (and
   synced) it and a message said so;
3. **gradients**: one ``GradTask`` per task of the next update, at that version, through any Transport
   (``Scheduler.run``: a dead worker's task re-runs under a new attempt number, into a new file). Each
   worker writes its gradient into the spare its task names (or a new file if it is gone), renames it
   ``g-uU-tT-aA.npy`` (``gradient``: no name is reused in a run), closes (and syncs) it, then answers
   with the loss and the compute time, which the server writes into the round's records.

Same files, same arithmetic, same order of additions as the fused round: the weights are bitwise
identical to a local run of the job, whatever the number of workers or the deaths on the way.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from memtrain.errors import MemtrainError
from memtrain.faults import fault_point
from memtrain.files import npy_header_bytes, open_npy, open_reused, writing_npy_rows
from memtrain.layout import spare_gradient_name, streamed_gradient_name, weights_path
from memtrain.train.messages import GradTask, Outcome, Result, Stretch
from memtrain.train.plan import Update
from memtrain.train.rounds import Participant, RoundFiles
from memtrain.train.weights import ready_building

if TYPE_CHECKING:
    from memtrain.models.params import ParamLayout
    from memtrain.train.gradient import TaskGradient
    from memtrain.train.maps import MapCache

PAGE_FLOATS = 4096 // 4  # float32 values per page: one write each maps every page of a new version's file
RunTasks = Callable[[list[GradTask], Callable[[], None]], list[Result]]  # tasks, the server's work meanwhile


class MappedBytes:
    """Bytes this process's tasks read through maps of the run's and the exchange's files: the weights a gradient
    reads, the slices a step reads (train/sliced.py). /proc/PID/io's ``rchar`` counts read calls, not pages read
    through a map, so the cluster benchmark (memtrain/benchmarks/cluster_costs.py) adds this count."""

    read = 0


class StreamedGradient:
    """A worker's part of a streamed gradient task: the gradient of a task's rows at the version it names, into a
    new file of its own name. ``rows(epoch, lo, hi)``: a task's rows, normalized (the worker's ``TaskRows``);
    ``gradient``: this process's loss and gradient (train/gradient.py); ``maps``: its maps kept between tasks."""

    def __init__(self, *, layout: ParamLayout, maps: MapCache, run_dir: Path, exchange: Path,
                 rows: Callable[[int, int, int], tuple[np.ndarray, np.ndarray]], gradient: TaskGradient):
        self.layout, self.maps, self.run_dir, self.exchange = layout, maps, run_dir, exchange
        self.rows, self.gradient = rows, gradient
        self.scratch = np.empty(0, dtype=np.float32)  # the gradient computed into it, kept between tasks

    def __call__(self, message: GradTask) -> Result:
        layout, size = self.layout, self.layout.size
        weights = self.maps.get(weights_path(self.run_dir, message.version), (size,), np.float32)
        MappedBytes.read += weights.nbytes
        x, y = self.rows(message.epoch, message.lo, message.hi)
        path = self.exchange / streamed_gradient_name(message.update, message.task, message.attempt)
        mapped = self.spare_map(message) if message.in_place else None
        if mapped is None and self.scratch.size != size:
            self.scratch = np.empty(size, dtype=np.float32)
        out = mapped if mapped is not None else self.scratch
        # the compute alone is timed, as in the round: the file is the stream's cost
        loss, seconds = self.gradient(weights, layout.views(weights), x, y, layout.views(out),
                                      version=message.version, task=message.task)
        if mapped is not None:
            os.rename(self.exchange / message.spare, path)  # only this task's attempts are handed this spare
        elif not (message.spare and rewrite(self.exchange / message.spare, path, out)):
            # pwrite from memory the process keeps: twice as fast as faulting in a new file's map
            with writing_npy_rows(path, (size,), np.float32, durable=False) as rows:
                rows.write(0, out)
        fault_point("after_grad_write")
        return Result(task=message.task, attempt=message.attempt, outcome=Outcome.DONE, loss=loss,
                      rows=message.hi - message.lo, seconds=seconds)

    def spare_map(self, message: GradTask) -> np.ndarray | None:
        """A writable map of the spare ``message`` names, to compute its gradient into (no copy); None if it is
        gone (an attempt of the task that died after renaming it). Maps are kept by inode (train/maps.py) and
        spares are recycled, so the pages are mapped already. One machine only: across machines a map's writes
        are not what another machine's open reads (close-to-open), so a cluster run's tasks never ask for it."""
        try:
            return self.maps.get(self.exchange / message.spare, (self.layout.size,), np.float32, "r+")
        except (FileNotFoundError, MemtrainError):
            return None


def rewrite(spare: Path, path: Path, values: np.ndarray) -> bool:
    """Write ``values`` over the data of the gradient file ``spare`` and rename it ``path``; False, having
    changed nothing that is read, when the spare is not there (a retry after a death took it) or not whole.

    A rewrite costs no allocation (the file's space and pages are there already): a new 4 MB file costs
    about 2 ms of page allocation before the copy. The server opens each gradient file afresh after its
    answer, so a rewritten file is read as a new one would be, on one machine or across many.
    """
    offset = len(npy_header_bytes(values.shape, values.dtype))
    fd = open_reused(spare, os.O_WRONLY)  # a link planted at the spare's name is removed, never written through
    if fd is None:
        return False
    try:
        if os.fstat(fd).st_size != offset + values.nbytes:
            return False
        data, at = memoryview(values).cast("B"), offset
        while data:  # pwrite may write less than asked
            done = os.pwrite(fd, data, at)
            data, at = data[done:], at + done
    finally:
        os.close(fd)
    try:
        os.rename(spare, path)
    except FileNotFoundError:  # another attempt of the task took it meanwhile (it wrote the same bits)
        return False
    return True


class StreamParticipant(Participant):
    """The server as the round's only participant, its gradients computed elsewhere (``run_tasks``).

    ``workers``: how many run the tasks at once (the records' ``participants``: the logbook times an
    update's compute as its busiest worker's). ``publish_sync``: makes a published version readable on
    other machines (an fsync on a network filesystem, nothing on a local one). ``recycle``: whether a
    retired version's file may be rewritten as a later one -- not when a worker on another machine may
    still hold a map of it.
    """

    def __init__(self, files: RoundFiles, stretch: Stretch, *, run_tasks: RunTasks, workers: Callable[[], int],
                 publish_sync: Callable[[Path], None], recycle: bool, heartbeat: Callable[[], bool] | None = None):
        super().__init__(files, stretch, alive=lambda: None, heartbeat=heartbeat)
        self.run_tasks, self.workers = run_tasks, workers
        self.publish_sync, self.recycle = publish_sync, recycle
        self.received: list[tuple[Path, str]] = []  # the gradient files of the update to step next, spare names
        self.stepped: list[tuple[Path, str]] = []  # those of the update stepped last, and their spare names
        self.spares: list[str] = []  # names of stepped gradient files, for the next tasks to rewrite
        self.attempts: list[int] = []  # the attempt of each task of the update to step next, in task order

    def run(self) -> Outcome:
        try:
            with np.errstate(all="ignore"):  # non-finite results are detected and reported, not warned about
                return super().run()
        finally:
            self.discard_received()
            discard([self.files.exchange / name for name in self.spares])
            self.spares = []

    def gradient_buffers(self, update: Update) -> list[np.ndarray]:
        size = self.files.size
        return [open_npy(path, shape=(size,), dtype=np.float32) for path, _ in self.received]

    def step(self, update: Update) -> None:
        try:
            super().step(update)
        finally:
            self.stepped, self.received = self.received, []

    def gradients(self, update: Update, *, stepped: Update | None = None) -> Update | None:
        files = self.files
        self.publish()  # the version the tasks name is published (and synced) before any message names it
        spares, self.spares = self.spares[:len(update.tasks)], self.spares[len(update.tasks):]
        spares += [""] * (len(update.tasks) - len(spares))
        tasks = [GradTask(task=rows.task, attempt=0, update=update.update, version=self.version, epoch=update.epoch,
                          lo=rows.lo, hi=rows.hi, spare=spare)
                 for rows, spare in zip(update.tasks, spares, strict=True)]
        self.computed_at[update.update] = self.version
        results = self.run_gradient_tasks(tasks)
        discard([files.exchange / spare for spare in spares if spare])  # one a worker did not take (a retry)
        self.attempts = [r.attempt for r in results]  # task t's gradient file is attempt attempts[t]'s
        self.received = [(files.exchange / streamed_gradient_name(update.update, r.task, r.attempt),
                          spare_gradient_name(update.update, r.task, r.attempt)) for r in results]
        for result in results:
            files.seconds[update.batch, result.task] = result.seconds
            files.loss[update.batch, result.task] = result.loss
        bad = [r.task for r in results if not math.isfinite(r.loss)]
        if bad:
            self.discard_received()
            self.skip(update, bad)
            return None
        return update

    def run_gradient_tasks(self, tasks: list[GradTask]) -> list[Result]:
        """The update's gradient tasks run to results (in task order), the server's housekeeping meanwhile."""
        return self.run_tasks(tasks, self.housekeeping)

    def publish(self) -> None:
        if self.unpublished is None:
            return
        super().publish()
        self.publish_sync(weights_path(self.files.run_dir, self.version))

    def record_participants(self, update: Update) -> int:
        return max(1, min(self.workers(), len(update.tasks)))

    def housekeeping(self) -> None:
        """While the workers compute: the last step's gradient files become spares, the next version's file
        is readied."""
        self.spare_stepped_and_ready_next()
        self.files.building(self.version + 1)[::PAGE_FLOATS] = 0  # its pages faulted in now, not during the step

    def spare_stepped_and_ready_next(self) -> None:
        """The last step's gradient files become spares; the next version's file is made (space reserved)."""
        files = self.files
        for path, name in self.stepped:
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, files.exchange / name)
                self.spares.append(name)
        self.stepped = []
        ready_building(files.run_dir, self.version + 1, files.size, files.server_pid, files.keep,
                       fast=True, recycle=self.recycle)

    def discard_received(self) -> None:
        discard([path for path, _ in self.stepped + self.received])
        self.stepped, self.received = [], []


def discard(paths: list[Path]) -> None:
    """Delete files the stream is done with (gradients, spares); one already gone is no error."""
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
