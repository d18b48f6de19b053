"""The overlapping modes: gradients streamed to the workers, steps in the server, nobody waits at a barrier.

docs/async.md says what they are for. Both run on the task stream (train/scheduler.py ``TaskStream``) and
the worker side of train/stream.py: a worker computes a gradient at the version its task names, into a
file of its own name. The server adds each update's gradients in the order below, steps the whole
vector (train/reduce.py: the same arithmetic as the round) into a file nobody reads and publishes it by
a rename that never replaces (RoundFiles.step_and_publish, the desk's too). Published versions are never
written again, so no process can read weights that are being written; a version is retired only once no
task in flight or still to come reads it (weights.versions_to_keep). What each loop computes is its
schedule's (train/schedule.py): ``Planned``, ``Arrival``, ``Recorded``.

- **Fixed staleness streamed** (``train.staleness = k``, ``train.staleness_in = "stream"``; by default it
  runs in the rounds, train/rounds.py): update n of the run computes its gradients at the version
  after max(0, n - k) updates (plan.gradient_base), added in task order. So at most k + 1 updates are in
  flight, the workers compute while the server steps, and the schedule is the plan's alone: bitwise
  identical with any worker count, after worker deaths and after a resume (a checkpoint carries the k
  older versions the next updates read, ``position.bases``).
- **Async** (``train.mode = "async"``), streamed when the server computes the gradients itself and for a
  replay (on worker processes it runs at the desk, train/desk.py, with the same lineage): each free
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
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from memtrain.config import Job
from memtrain.errors import MemtrainError
from memtrain.layout import spare_gradient_name, streamed_gradient_name
from memtrain.train.lineage import Lineage
from memtrain.train.logbook import Logbook
from memtrain.train.messages import GradTask, Result
from memtrain.train.optim import learning_rate
from memtrain.train.plan import TaskRange, Update, task_stream
from memtrain.train.rounds import RoundFiles
from memtrain.train.schedule import Arrival, Planned, Recorded
from memtrain.train.scheduler import TaskStream
from memtrain.train.state import Position
from memtrain.train.stream import discard
from memtrain.train.weights import weights_checksum

Arrived = tuple[GradTask, Result]


class Overlap:
    """One run's overlapping loop: ``epoch`` runs the rest of an epoch from ``position``; ``replay`` a lineage.

    ``look``: the server's own work between two updates (logs, progress). ``per_epoch``: updates per epoch
    (async mode: groups). ``publish_sync``/``recycle``: as for train/stream.py's participant.
    """

    def __init__(self, *, job: Job, files: RoundFiles, stream: TaskStream, logbook: Logbook, per_epoch: int,
                 look: Callable[[], None], publish_sync: Callable[[Path], None] = lambda path: None,
                 recycle: bool = True):
        self.job, self.files, self.stream, self.logbook = job, files, stream, logbook
        self.per_epoch, self.look = per_epoch, look
        self.publish_sync, self.recycle = publish_sync, recycle
        self.total = per_epoch * job.train.epochs
        self.spares: list[str] = []  # stepped gradient files, for the next tasks to rewrite (train/stream.py)
        self.tickets = 0  # async mode: each task's own number in this server's life (its file's name)
        self.left_from: int | None = None  # the oldest version left on disk, once the first step has retired

    def close(self) -> None:
        discard([self.files.exchange / name for name in self.spares])
        self.spares = []

    # --- fixed staleness ---

    def staleness_epoch(self, position: Position) -> None:
        """The rest of ``position``'s epoch: update n of the run at the version after max(0, n - k) updates."""
        planned = Planned(staleness=self.job.train.staleness)
        updates = self.files.plan.updates(position.epoch)
        first = updates[0].update  # the epoch's first update, counted over the run
        # updates done -> the version then (the logbook keeps position.bases as updates are applied)
        bases = dict(position.bases) | {first + position.batch: position.version}
        submitted = position.batch
        arrived: dict[tuple[int, int], Arrived] = {}
        while position.batch < len(updates):
            while first + submitted in planned.startable(first + position.batch, first + len(updates)):
                version = bases[planned.at(first + submitted)]
                for rows in updates[submitted].tasks:
                    self.submit(update=updates[submitted].update, epoch=position.epoch, rows=rows, version=version)
                submitted += 1
            for task, result in self.stream.wait():
                arrived[task.update, task.task] = (task, result)
            while position.batch < submitted and all((updates[position.batch].update, t.task) in arrived
                                                     for t in updates[position.batch].tasks):
                update = updates[position.batch]
                live = planned.live(update.update + 1)  # the bases of every later update
                self.apply(position, update, [arrived.pop((update.update, t.task)) for t in update.tasks],
                           oldest=bases.get(live.start, position.version))
                bases = dict(position.bases)
                self.look()

    # --- async ---

    def async_epoch(self, position: Position) -> None:
        """The rest of ``position``'s epoch: every task not applied yet, each at the newest version when a
        worker is free, applied ``async_group`` at a time in arrival order."""
        arrival = Arrival(group=self.job.train.async_group, max_staleness=self.job.train.max_staleness)
        applied = set(position.applied)
        remaining = deque(t for t in task_stream(self.files.plan.updates(position.epoch)) if t.task not in applied)
        reading: Counter[int] = Counter()  # versions read by the tasks in flight
        group: list[Arrived] = []
        recomputed = 0  # stale gradients computed again while this group filled
        while remaining or self.stream.in_flight or group:
            self.top_up(remaining, reading, position.version, position.epoch)
            results = self.stream.wait()
            for n, (task, result) in enumerate(results):
                reading[task.version] -= 1
                if not reading[task.version]:
                    del reading[task.version]  # the oldest read is looked up per group: only live versions
                # The worker that answered gets its next task at once, at the newest version published so
                # far: it computes while the server applies what it returned.
                self.top_up(remaining, reading, position.version, position.epoch)
                if arrival.stale(position.version, task.version):
                    discard([self.gradient_path(task)])
                    remaining.appendleft(TaskRange(task.task, task.lo, task.hi))
                    recomputed += 1
                    continue
                group.append((task, result))
                last = not (remaining or self.stream.in_flight or n + 1 < len(results))  # the epoch's last gradient
                if arrival.full(len(group), last):
                    self.apply_group(position, group, reading, recomputed)
                    group, recomputed = [], 0
                    self.look()
        position.applied = []

    def top_up(self, remaining: deque[TaskRange], reading: Counter[int], version: int, epoch: int) -> None:
        """Give every free worker the next task of epoch ``epoch``, at ``version``."""
        while remaining and self.stream.free():
            rows = remaining.popleft()
            self.tickets += 1
            reading[version] += 1
            self.submit(update=self.tickets, epoch=epoch, rows=rows, version=version)

    def apply_group(self, position: Position, group: list[Arrived], reading: Counter[int], recomputed: int) -> None:
        index = position.update_index(self.per_epoch)
        update = Update(position.epoch, position.batch, index,
                        tuple(TaskRange(i, task.lo, task.hi) for i, (task, _) in enumerate(group)))
        oldest = min(reading, default=position.version)
        self.apply(position, update, group, oldest=oldest, ids=[task.task for task, _ in group],
                   discarded=recomputed)
        position.applied = position.applied + [task.task for task, _ in group]

    # --- replay ---

    def replay(self, position: Position, lineage: Lineage, check: Callable[[int, str, str | None], None]) -> None:
        """Run the lineage's steps again: each gradient at its recorded version, added in the recorded order,
        stepped with the recorded learning rate; ``check(version, recorded, found)`` after each."""
        recorded = Recorded(lineage.steps)
        steps, reads_from = recorded.steps, recorded.reads_from()  # the oldest version any step from i on reads
        submitted, applied = 0, 0
        arrived: dict[tuple[int, int], Arrived] = {}
        while applied < len(steps):
            while submitted < len(steps) and recorded.ready(submitted, position.version):
                step = steps[submitted]
                for i, gradient in enumerate(step.gradients):
                    self.submit(update=submitted, epoch=step.epoch - 1,
                                rows=TaskRange(step.task(i), gradient.lo, gradient.hi), version=gradient.at)
                submitted += 1
            for task, result in self.stream.wait():
                arrived[task.update, task.task] = (task, result)
            while applied < submitted and all((applied, steps[applied].task(i)) in arrived
                                              for i in range(len(steps[applied].gradients))):
                step = steps[applied]
                got = [arrived.pop((applied, step.task(i))) for i in range(len(step.gradients))]
                position.epoch, position.batch = step.epoch - 1, step.batch - 1
                update = Update(step.epoch - 1, step.batch - 1, step.update - 1,
                                tuple(TaskRange(i, g.lo, g.hi) for i, g in enumerate(step.gradients)))
                found = self.apply(position, update, got, oldest=reads_from[applied + 1] if applied + 1 < len(steps)
                                   else position.version, lr=step.lr, **({"ids": list(step.ids)} if step.ids else {}))
                check(step.version, step.checksum, found)
                applied += 1
                self.look()

    # --- what every mode shares ---

    def submit(self, *, update: int, epoch: int, rows: TaskRange, version: int) -> None:
        """Hand out the gradient of a task of epoch ``epoch`` (its rows: ``Plan.rows``) at ``version``."""
        spare = self.spares.pop() if self.spares else ""
        self.stream.submit(GradTask(task=rows.task, attempt=0, update=update, version=version, epoch=epoch,
                                    lo=rows.lo, hi=rows.hi, spare=spare, in_place=self.recycle))

    def gradient_path(self, task: GradTask) -> Path:
        return self.files.exchange / streamed_gradient_name(task.update, task.task, task.attempt)

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
            name = spare_gradient_name(task.update, task.task, task.attempt)
            with contextlib.suppress(FileNotFoundError):
                os.rename(path, self.files.exchange / name)
                self.spares.append(name)
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


def replay_mismatch(version: int, recorded: str, found: str | None, lineage: Lineage) -> MemtrainError:
    return MemtrainError(f"the replay differs from the run at weight version {version}", path=lineage.path,
                         where=f"version {version}", expected=recorded,
                         found=found or "a non-finite update (nothing published)",
                         hint="the data, the code or the machine's numerics changed since the run")
