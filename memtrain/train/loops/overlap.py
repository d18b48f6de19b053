"""The server stepping the whole vector, in one loop: gradients streamed to the workers, nobody waits at a barrier.

docs/async.md says what its modes are for. They run on the task stream (train/server/scheduler.py ``TaskStream``) and
the worker side of train/loops/stream.py: a worker computes a gradient at the version its task names, into a
file of its own name. The server adds each update's gradients in the order below, steps the whole
vector (train/loops/reduce.py: the same arithmetic as the round) into a file nobody reads and publishes it by
a rename that never replaces (RoundFiles.step_and_publish, the desk's too). Published versions are never
written again, so no process can read weights that are being written; a version is retired only once no
task in flight or still to come reads it (weights.versions_to_keep). One loop (``Overlap.run``) runs all
three below; what it computes, and in which order it adds it, is its schedule's agenda (train/schedule.py:
``Planned``, ``Arrival``, ``Recorded``).

- **Fixed staleness streamed** (``train.staleness = k``, ``train.staleness_in = "stream"``; by default it
  runs in the rounds, train/loops/rounds.py): update n of the run computes its gradients at the version
  after max(0, n - k) updates (plan.gradient_base), added in task order. So at most k + 1 updates are in
  flight, the workers compute while the server steps, and the schedule is the plan's alone: bitwise
  identical with any worker count, after worker deaths and after a resume (a checkpoint carries the k
  older versions the next updates read, schedule.PlannedState).
- **Async** (``train.mode = "async"``), streamed when the server computes the gradients itself and for a
  replay (on worker processes it runs at the desk, train/loops/desk.py, with the same lineage): each free
  worker takes the epoch's next task at the newest version
  (before the server has applied the gradient it just returned); the server applies every
  ``async_group`` gradients in the order they arrive. A gradient more than ``max_staleness`` versions
  behind the newest is deleted and its rows computed again, never applied. The lineage records, per
  version, the rows, the version each gradient was computed at and its task number, in the order added:
- **Replay** (``memtrain train --replay RUN``) runs exactly that record again and checks every version's
  checksum against it.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from memtrain.train.exchange.area import SPARE_GRADIENT, STREAMED_GRADIENT, discard
from memtrain.train.exchange.weights import weights_checksum
from memtrain.train.loops.mapped import RoundFiles
from memtrain.train.messages import GradTask
from memtrain.train.optim import learning_rate
from memtrain.train.plan import Update
from memtrain.train.records.logbook import Logbook
from memtrain.train.records.state import Position
from memtrain.train.schedule import Agenda, Arrived, Start

if TYPE_CHECKING:
    from memtrain.train.loops.stream import ServerGradients
    from memtrain.train.server.scheduler import TaskStream


class Overlap:
    """The server stepping the whole vector: ``run`` is the one loop of every schedule it runs.

    ``stream``: where the gradients are computed (the scheduler's ``TaskStream`` to worker processes, or
    ``ServerGradients``: the server itself, train/loops/stream.py). ``chores(position)``: the server's chores
    between two updates (logs, progress). ``per_epoch``: updates per epoch (async mode: groups), for ``epochs``
    epochs. ``publish_sync``: what makes a published version readable by other machines (None: nothing);
    ``recycle``: a retired version's file becomes the next one's (``RoundFiles.step_and_publish``).
    """

    def __init__(self, *, epochs: int, files: RoundFiles, stream: TaskStream | ServerGradients, logbook: Logbook,
                 per_epoch: int, chores: Callable[[Position], None],
                 publish_sync: Callable[[Path], None] | None = None, recycle: bool = True):
        self.files, self.stream, self.logbook = files, stream, logbook
        self.per_epoch, self.chores = per_epoch, chores
        self.publish_sync, self.recycle = publish_sync, recycle
        self.total = per_epoch * epochs
        self.spares: list[str] = []  # stepped gradient files, for the next tasks to rewrite (train/loops/stream.py)
        self.left_from: int | None = None  # the oldest version left on disk, once the first step has retired

    def close(self) -> None:
        discard([self.files.exchange / name for name in self.spares])
        self.spares = []

    def run(self, position: Position, agenda: Agenda) -> None:
        """The one loop: hand out what ``agenda`` says can start, wait for gradients, apply each update the
        agenda says is due (its gradients in the order it gives), until it is done. The rest of an epoch
        (``Planned.agenda``, ``Arrival.agenda``) or a whole replay (``Recorded.agenda``)."""
        stream = self.stream
        while stream.in_flight or not agenda.done():
            self.submit(agenda.start(stream.free(), position.version))
            results = stream.wait()
            last = len(results) - 1
            for n, (task, result) in enumerate(results):
                # The worker that answered gets its next task at once, at the newest version published so
                # far: it computes while the server applies what it returned.
                self.submit(agenda.start(stream.free(), position.version))
                if not agenda.arrived(task, result, n < last or stream.in_flight > 0):  # others still out?
                    discard([self.gradient_path(task)])  # too stale: computed again, never applied
                    continue
                due = agenda.due()
                while due is not None:
                    update = due.update
                    position.epoch, position.batch = update.epoch, update.batch  # a replay's step says where
                    checksum = self.apply(position, update, due.gradients, oldest=due.oldest, lr=due.lr, **due.extra)
                    agenda.applied(position, checksum)
                    self.chores(position)
                    due = agenda.due()
        position.schedule.epoch_done()  # the epoch is over (async mode: none of its tasks waits to be applied)

    # --- the loop's parts ---

    def submit(self, starts: list[Start]) -> None:
        """Hand out each gradient in ``starts`` (the agenda's, in its order): a task's rows (``Plan.rows``) at a
        version."""
        for ticket, epoch, rows, version in starts:
            spare = self.spares.pop() if self.spares else ""
            self.stream.submit(GradTask(task=rows.task, attempt=0, ticket=ticket, version=version, epoch=epoch,
                                        lo=rows.lo, hi=rows.hi, spare=spare, in_place=self.recycle))

    def gradient_path(self, task: GradTask) -> Path:
        return STREAMED_GRADIENT.path(self.files.exchange, task.ticket, task.task, task.attempt)

    def apply(self, position: Position, update: Update, arrived: list[Arrived], *, oldest: int,
              lr: float | None = None, **lineage: object) -> str | None:
        """Step ``update`` (its gradients ``arrived``, in the order they are added) into the next version and
        log it; returns the version's checksum. A non-finite loss or step skips it: None (the logbook stops
        the run if the job says so). ``oldest``: the oldest version a task in flight or still to come reads."""
        if lr is None:
            lr = learning_rate(self.files.optimizer, update.update, self.total)
        paths = [self.gradient_path(task) for task, _ in arrived]
        bad = [rows for rows, (_, result) in zip(update.tasks, arrived, strict=True) if not math.isfinite(result.loss)]
        version = position.version
        checksum = None if bad else self.step(version, paths, update.rows, lr, oldest)
        for path, (task, _) in zip(paths, arrived, strict=True):  # the files become spares for later tasks
            spare = SPARE_GRADIENT.path(self.files.exchange, task.ticket, task.task, task.attempt)
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, spare)
                self.spares.append(spare.name)
        self.logbook.applied(position, update, [result.loss for _, result in arrived],
                             version=None if checksum is None else version + 1,
                             at=[task.version for task, _ in arrived], checksum=checksum or "",
                             compute=max(result.seconds for _, result in arrived), bad=bad, when=time.time(), lr=lr,
                             **lineage)
        return checksum

    def step(self, version: int, gradients: list[Path], rows: int, lr: float, oldest: int) -> str | None:
        """``version`` + the optimizer step of the mean of ``gradients`` -> version + 1, published
        (RoundFiles.step_and_publish); its checksum, or None (nothing published) if it came out non-finite.
        ``oldest``: the oldest version a task in flight or still to come reads."""
        files, size = self.files, self.files.size
        grads = [files.maps.get(path, (size,), np.float32) for path in gradients]  # spares: the same inodes again
        finite, self.left_from = files.step_and_publish(version, grads, rows, lr, oldest=oldest,
                                                        left_from=self.left_from, recycle=self.recycle,
                                                        publish_sync=self.publish_sync)
        return weights_checksum(files.digests[(version + 1) % 2], size) if finite else None
