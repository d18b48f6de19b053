"""Records of finished updates (train/exchange/marks.py) -> lineage and metric lines, and where the run stands.

The participants of a stretch write each update's record (each task's loss and compute time, how the
update ended) and the publisher moves the ledger past it; the server reads the records up to the
ledger, moves its ``Position`` along and writes the log lines -- in batches, while the rounds go on, and
always before an epoch's record, a checkpoint, an interrupt or the end of the run. A crash in between
loses only lines that a resume rewrites anyway (it truncates the logs to its checkpoint).

Each update's two lines are made here, numbered once (train/records/counters.py): its lineage line
(``update_record``; the format in docs/formats.md, read back by train/records/lineage.py) and its metric line.
The logbook's ``Chores`` say when they are written, and the progress line shown: at most every
``PROGRESS_SECONDS``, between two updates (the engines call them, train/server/engines.py).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from memtrain.errors import MemtrainError
from memtrain.faults import fault_point
from memtrain.files import open_npy
from memtrain.layout import building_path, weights_path
from memtrain.records import LINEAGE_UPDATE, METRICS_UPDATE, make
from memtrain.train.exchange.area import GRADIENT_BUFFER
from memtrain.train.exchange.marks import PUBLISHED, SKIPPED, Ledger, UpdateRecord, read_records
from memtrain.train.exchange.weights import commit_weights
from memtrain.train.optim import OptimizerConfig, learning_rate
from memtrain.train.plan import Plan, TaskRange, Update, gradient_bank, task_owner
from memtrain.train.records.counters import batch_number, epoch_number, update_number
from memtrain.train.records.run_dir import RunDir
from memtrain.train.records.state import Position

if TYPE_CHECKING:
    from memtrain.progress import Reporter


def update_record(*, version: int, update: int, epoch: int, batch: int, tasks: list[tuple[int, int]],
                  at: list[int], lr: float, checksum: str, **extra: Any) -> dict[str, Any]:
    """The lineage line of ``version``, made from ``version - 1`` by the gradients of ``tasks`` (the plan's tasks, as
    positions [lo, hi) of the epoch's row sequence: ``Plan.rows``; in the order they were added) computed at
    versions ``at``."""
    if len(tasks) != len(at):
        raise ValueError(f"{len(tasks)} row ranges but {len(at)} versions")
    return make(LINEAGE_UPDATE, version=version, parent=version - 1, update=update, epoch=epoch, batch=batch,
                split="train", tasks=[list(t) for t in tasks], at=list(at), lr=lr, checksum=checksum, **extra)


class Logbook:
    def __init__(self, *, run: RunDir, exchange: Path, plan: Plan, records: np.ndarray, optimizer: OptimizerConfig,
                 on_nonfinite: str, size: int, describe_rows: Callable[..., str], log: Callable[[str], None],
                 staleness: int = 0):
        self.run, self.exchange, self.plan, self.records = run, exchange, plan, records
        self.staleness = staleness  # fixed staleness: its gradient banks, and versions only recorded
        self.optimizer, self.on_nonfinite, self.size = optimizer, on_nonfinite, size
        self.describe_rows, self.log = describe_rows, log
        self.lineage: list[dict[str, Any]] = []
        self.metrics: list[dict[str, Any]] = []
        self.timeline: list[tuple[int, float, float]] = []  # (update, time, compute s) of each update logged

    def begin_stretch(self, first: int, stop: int) -> None:
        """Updates [first, stop) of the epoch not recorded yet: a stretch is about to write their records."""
        self.records["status"][first:stop] = 0

    def catch_up(self, position: Position, ledger: Ledger, *, final: bool) -> None:
        """Log every update up to the ledger's, moving ``position`` along.

        With ``final`` (the stretch has ended, every participant stopped) also an update published but
        not yet in the ledger (its publisher died between the rename and the ledger), and a non-finite
        update with ``on_nonfinite = "stop"``, which raises.
        """
        per_epoch = self.plan.per_epoch
        if position.batch >= per_epoch:
            return
        updates = self.plan.updates(position.epoch)
        # the ledger's update and those before it, read as one group (an epoch's updates are numbered in a row)
        end = min(per_epoch, max(position.batch, ledger.update - updates[0].update + 1))
        for record in read_records(self.records[position.batch:end]):
            if record.status == SKIPPED and self.on_nonfinite == "stop" and not final:
                return
            self.finish(position, updates[position.batch], record)
        while final and position.batch < per_epoch and \
                self._published_after_ledger(self.records[position.batch], position):
            self.finish(position, updates[position.batch],
                        read_records(self.records[position.batch:position.batch + 1])[0])

    def _published_after_ledger(self, row: np.void, position: Position) -> bool:
        """Whether the update after the ledger was published, its publisher dying before the ledger: renamed
        into place, or only recorded (fixed staleness recycles the oldest version in between: then the file,
        complete since every slice of it was met, is renamed here, as its publisher was about to)."""
        version = position.version + 1
        if not (row["status"] == PUBLISHED and row["version"] == version):
            return False
        if self.staleness and not weights_path(self.run.path, version).exists() and \
                (building := building_path(self.run.path, version, os.getpid())).exists():
            commit_weights(building, self.run.path, version)
            self.log(f"published version {version}: its publisher died after recording it, before the rename")
        return weights_path(self.run.path, version).exists()

    def finish(self, position: Position, update: Update, record: UpdateRecord) -> None:
        tasks = len(update.tasks)
        participants = max(1, record.participants)
        seconds = record.seconds[:tasks]
        compute = sum(seconds) if participants == 1 else \
            max(sum(seconds[t] for t in range(tasks) if task_owner(t, participants) == slot)
                for slot in range(min(participants, tasks)))
        self.applied(position, update, record.loss[:tasks],
                     version=record.version if record.status == PUBLISHED else None,
                     at=[record.at] * tasks,  # the round computes an update's gradients at one version
                     checksum="xxh3-128-blocks:" + record.checksum.hex(), compute=compute,
                     bad=[t for t in update.tasks if record.bad[t.task]], when=record.time)

    def applied(self, position: Position, update: Update, losses: list[float], *, version: int | None,
                at: list[int], checksum: str, compute: float, bad: list[TaskRange], when: float,
                lr: float | None = None, **extra: Any) -> None:
        """Log one finished update (``version`` None: skipped, non-finite) and move ``position`` past it.

        ``losses``: each gradient's summed loss, in the order they were added; ``at``: the version each was
        computed at; ``extra``: more lineage fields (async mode's ``ids`` and ``discarded``)."""
        loss = sum(losses)  # the order the step adds them in
        if lr is None:
            lr = learning_rate(self.optimizer, update.update, self.plan.total_updates)
        before = position.version
        number, epoch, batch = update_number(update.update), epoch_number(update.epoch), batch_number(update.batch)
        if version is not None:
            position.version = version
            self.lineage.append(update_record(version=version, update=number, epoch=epoch, batch=batch,
                                              tasks=[(t.lo, t.hi) for t in update.tasks], at=at, lr=lr,
                                              checksum=checksum, **extra))
        else:
            self.nonfinite(update, bad)
            position.skipped += 1
        position.epoch_loss += loss
        rows = update.rows
        position.epoch_rows += rows
        position.batch += 1
        position.schedule.logged(update.update, before, position.version)
        self.metrics.append(make(
            METRICS_UPDATE, kind="update", epoch=epoch, batch=batch, update=number, version=position.version,
            loss=loss / rows, rows=rows, skipped=version is None, compute_s=compute, time=when))
        self.timeline.append((update.update, when, compute))
        fault_point("after_update_logged")

    def nonfinite(self, update: Update, bad: list[TaskRange]) -> None:
        if not bad and self.on_nonfinite == "stop":  # the stretch stopped right here: the buffers are intact
            bad = self.nonfinite_gradients(update)
        where = ", ".join(f"task {t.task} ({self.describe_rows(t.lo, t.hi, epoch=update.epoch)})" for t in bad) or \
            ("the mean gradient or the new weights (each task's gradient was finite)" if self.on_nonfinite == "stop"
             else "the mean gradient or the new weights")
        text = (f"non-finite loss or gradient at update {update_number(update.update)} (epoch "
                f"{epoch_number(update.epoch)}, batch {batch_number(update.batch)}): {where}")
        if self.on_nonfinite == "stop":
            self.write()
            raise MemtrainError(text, hint="lower train.lr, check the data, or set train.on_nonfinite = \"skip\"; "
                                           "the published weights are unchanged")
        self.log(text + "; update skipped")

    def nonfinite_gradients(self, update: Update) -> list[TaskRange]:
        """The tasks whose gradient buffer holds NaN/Inf (read only on this rare path, never per update)."""
        bank = gradient_bank(update.update, self.staleness)
        return [rows for rows in update.tasks
                if not np.isfinite(open_npy(GRADIENT_BUFFER.path(self.exchange, rows.task, bank), shape=(self.size,),
                                            dtype=np.float32)).all()]

    def write(self) -> None:
        """Append the lines logged since the last call."""
        if self.lineage:
            self.run.lineage(*self.lineage, native=True)  # update_record of Python ints, floats, str, lists
            self.lineage.clear()
        if self.metrics:
            self.run.metric(*self.metrics)
            self.metrics.clear()


PROGRESS_SECONDS = 0.2  # between the server's chores while work is in flight: logs and the progress line


class Chores:
    """The server's chores: its own work between two updates (in this package always called its chores): the
    logbook's lines written and the progress line shown, at most every PROGRESS_SECONDS (``due``); in a stretch
    it runs itself, a stop or the placement's end of the stretch looked at too (``in_stretch``). ``epoch``
    hands it the epoch's progress bar (the epoch loop's)."""

    def __init__(self, logbook: Logbook):
        self.logbook = logbook
        self.bar: Reporter | None = None
        self.epoch_started = time.monotonic()
        self.next_time = 0.0

    def epoch(self, bar: Reporter | None, started: float) -> None:
        self.bar, self.epoch_started = bar, started

    def due(self) -> bool:
        """Whether PROGRESS_SECONDS have passed since the server last did its chores."""
        now = time.monotonic()
        if now < self.next_time:
            return False
        self.next_time = now + PROGRESS_SECONDS
        return True

    def report(self, position: Position) -> None:
        """The lines logged so far written; the progress line (loss and speed of the epoch so far) shown."""
        self.logbook.write()
        if self.bar is not None:
            rate = position.epoch_rows / max(time.monotonic() - self.epoch_started, 1e-9)
            self.bar.update(position.batch, f"loss {position.epoch_loss / max(position.epoch_rows, 1):.4f}"
                                            f"  {rate:,.0f} samples/s")

    def after_update(self, position: Position) -> None:
        """The chores after an update the server stepped itself, now and then."""
        if self.due():
            self.report(position)

    def stretch(self, position: Position, ledger: Ledger) -> None:
        """The chores while a stretch runs: the updates up to ``ledger`` logged, progress shown."""
        self.logbook.catch_up(position, ledger, final=False)
        self.report(position)

    def in_stretch(self, position: Position, ledger: Callable[[], Ledger], ends: Callable[[], bool]) -> bool:
        """The chores between two updates of a stretch the server runs itself, now and then: the updates up to
        the ``ledger`` logged, progress shown; True ends the stretch there (``ends``: a stop, or the placement's
        probe is over: ``EngineContext.stretch_ends``)."""
        if not self.due():
            return False
        self.stretch(position, ledger())
        return ends()
