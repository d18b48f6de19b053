"""A stretch of the plan -> gradients, steps and published weight versions, by the participants alone.

Every participant runs the same loop: a worker process (one per slot), or the server itself when it
runs the rounds alone (``train.workers = 0``). The loop, top to bottom:

    pending = None
    for update in stretch:
        pending = round(step=pending, grads=update)
    round(step=pending, grads=None)

A round is the step of the previous update and the gradients of this one:

1. **step** ``pending``: my slice of the parameters (if I own one) -- add the update's gradient buffers
   in task order, divide by its rows, apply the optimizer, write the slice into the file of the next
   version (and the optimizer state, and the slice's block digests); mark my step and wait until every
   participant has. The new version is complete.
2. **gradients** of ``update``: each of my tasks, at that version, into the task's buffer; mark my
   gradients. Slot 0 (the publisher) then publishes the new version (a rename), records it, readies the
   file of the version after it and marks ready. Wait until every participant has marked, and ready.

The overlap: nobody waits for the server, and the publisher's bookkeeping runs while its peers are
still computing (it is between its own marks and its own wait). Two meetings per update, at marks
(train/marks.py); the server only watches the board, the processes and the clock.

Non-finite: a task whose loss is NaN/Inf marks itself so; everyone sees it at the meeting and the
update is skipped (no step; its next update is computed at the same version). A step slice that comes
out non-finite is marked so too; the new version is void and the update is skipped the same way. With
``train.on_nonfinite = "stop"`` every participant ends the stretch there instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from memtrain.dataset import Dataset
from memtrain.faults import fault_point
from memtrain.files import DIGEST_BYTES
from memtrain.layout import (
    ROUND_RECORDS,
    WEIGHT_DIGESTS,
    building_path,
    gradient_buffer_name,
    state_buffer_name,
    weights_path,
)
from memtrain.train.context import ModelContext
from memtrain.train.maps import MapCache
from memtrain.train.marks import (
    GRADIENT,
    LOSS_NONFINITE,
    PUBLISH,
    PUBLISHED,
    SKIPPED,
    STEP,
    WAITING,
    Board,
    Cancelled,
    Ledger,
    open_records,
)
from memtrain.train.messages import Outcome, RoundSetup, Stretch
from memtrain.train.optim import OptimizerConfig, learning_rate, state_slots
from memtrain.train.plan import Plan, TaskRange, Update, step_slices, task_owner
from memtrain.train.reduce import reduce_and_step
from memtrain.train.weights import BLOCK, block_count, commit_weights, ready_building, weights_checksum

DROP_DELETED_EVERY = 16  # updates between checks for maps of deleted files (a retired version not recycled)


class NonfiniteStop(Exception):
    """An update came out non-finite and the job says to stop there."""


class RoundFiles:
    """What a process keeps for the rounds across stretches: the model, the plan and the round's files, mapped.

    The files are made by the server before any stretch (``create_round_files`` in train/server.py): a
    gradient buffer per task, the optimizer state (two parities), the block digests, the records.
    """

    def __init__(self, *, context: ModelContext, dataset: Dataset, run_dir: Path, exchange: Path, server_pid: int,
                 optimizer: OptimizerConfig, setup: RoundSetup, board: Board, maps: MapCache, straggler: float = 1.0):
        self.context, self.run_dir, self.exchange, self.server_pid = context, run_dir, exchange, server_pid
        self.straggler = straggler  # a test hook (faults.straggler_factor): this process's gradients made slower
        self.optimizer, self.setup, self.board, self.maps = optimizer, setup, board, maps
        self.train = dataset.split("train")
        self.size = context.layout.size
        self.plan = Plan(self.train.rows, setup.batch_size, setup.tasks_per_update, setup.seed, setup.epochs)
        self.records = open_records(exchange / ROUND_RECORDS, self.plan.per_epoch, setup.tasks_per_update)
        self.loss, self.seconds, self.bad = self.records["loss"], self.records["seconds"], self.records["bad"]
        self.grads = [self._map(exchange / gradient_buffer_name(t)) for t in range(setup.tasks_per_update)]
        self.state = [{slot: self._map(exchange / state_buffer_name(slot, parity)) for slot in state_slots(optimizer)}
                      for parity in (0, 1)]
        self.digests = maps.get(exchange / WEIGHT_DIGESTS, (block_count(self.size), DIGEST_BYTES), np.uint8, "r+")

    def _map(self, path: Path, mode: str = "r+") -> np.ndarray:
        return self.maps.get(path, (self.size,), np.float32, mode)

    def weights(self, version: int) -> np.ndarray:
        return self._map(weights_path(self.run_dir, version), "r")

    def building(self, version: int) -> np.ndarray:
        return self._map(building_path(self.run_dir, version, self.server_pid))

    def rows(self, rows: TaskRange) -> tuple[np.ndarray, np.ndarray]:
        x, y = self.train.read(rows.lo, rows.hi)
        return self.context.normalize(x), np.asarray(y)

    def ready_building(self, version: int) -> None:
        ready_building(self.run_dir, version, self.size, self.server_pid, self.setup.keep_versions, fast=True)


class Participant:
    """One slot's part in one stretch: the loop, and the pieces of a round it is made of."""

    def __init__(self, files: RoundFiles, stretch: Stretch, *, alive: Callable[[], None],
                 heartbeat: Callable[[], bool] | None = None):
        self.files, self.stretch, self.alive, self.heartbeat = files, stretch, alive, heartbeat
        self.generation, self.slot = stretch.generation, stretch.slot
        self.version = stretch.version
        self.weights = files.weights(stretch.version)  # the version the next gradients are computed at
        slices = step_slices(files.size, stretch.slices, BLOCK)
        self.slice = slices[self.slot] if self.slot < len(slices) else None
        self.unpublished: Update | None = None  # slot 0: an update whose version is complete, not yet renamed

    def run(self) -> Outcome:
        updates = self.files.plan.updates(self.stretch.epoch)[self.stretch.first:self.stretch.stop]
        try:
            pending = None
            for update in updates:
                pending = self.round(step=pending, grads=update)
                if self.heartbeat is not None and self.heartbeat():  # the server's own work, when it runs the loop
                    break
            self.round(step=pending, grads=None)  # the stretch's last step: evaluation needs its version
        except Cancelled:
            return Outcome.CANCELLED
        except NonfiniteStop:
            return Outcome.NONFINITE
        return Outcome.DONE

    def round(self, *, step: Update | None, grads: Update | None) -> Update | None:
        """Step ``step`` into the next version, then compute ``grads`` at it; returns ``grads`` unless it
        was skipped (its step is then the next round's)."""
        if step is not None:
            self.step(step)
        if grads is None:
            self.publish()  # nothing left to overlap the publication with
            return None
        return self.gradients(grads)

    # --- 1. the step ---

    def step(self, update: Update) -> None:
        files, board = self.files, self.files.board
        out = files.building(self.version + 1)
        finite = True
        if self.slice is not None:
            board.doing(self.slot, self.generation, STEP, update.update, self.slot)
            parity = self.version % 2
            finite = reduce_and_step(self.gradient_buffers(update), update.rows, self.weights,
                                     files.state[parity], out, files.state[1 - parity], *self.slice, files.optimizer,
                                     self.version + 1, learning_rate(files.optimizer, update.update,
                                                                     files.plan.total_updates), files.digests,
                                     files.context.layout.trainable)
        board.mark_step(self.generation, update.update, self.slot, finite)
        board.doing(self.slot, self.generation, WAITING, update.update)
        if not board.wait_step(self.generation, update.update, self.stretch.participants, self.alive):
            self.skip(update, ())  # the new version is void; nobody reads it, the next step overwrites it
            return
        self.weights, self.version = out, self.version + 1
        if self.slot == 0:
            self.unpublished = update
        if update.update % DROP_DELETED_EVERY == 0:
            files.maps.drop_deleted()

    def gradient_buffers(self, update: Update) -> list[np.ndarray]:
        """The update's gradients, in task order (train/stream.py reads them from files workers sent)."""
        return [self.files.grads[t.task] for t in update.tasks]

    # --- 2. the gradients ---

    def gradients(self, update: Update) -> Update | None:
        files, board = self.files, self.files.board
        finite = True
        for rows in update.tasks:
            if task_owner(rows.task, self.stretch.participants) == self.slot:
                finite = self.gradient(update, rows) and finite
        board.mark_gradients(self.generation, update.update, self.slot, finite)
        if self.slot == 0:
            self.publish()
            files.ready_building(self.version + 1)
            board.mark_ready(self.generation, update.update)
        board.doing(self.slot, self.generation, WAITING, update.update)
        if not board.wait_gradients(self.generation, update.update, self.stretch.participants, self.alive):
            losses = files.loss[update.batch, :len(update.tasks)]
            self.skip(update, np.flatnonzero(~np.isfinite(losses)).tolist())
            return None
        return update

    def gradient(self, update: Update, rows: TaskRange) -> bool:
        """One task's gradient into its buffer; False if its loss is not finite."""
        files = self.files
        files.board.doing(self.slot, self.generation, GRADIENT, update.update, rows.task)
        x, y = files.rows(rows)
        fault_point("before_grad_write")
        layout = files.context.layout
        started = time.perf_counter()
        model = files.context.model
        seeded = {"seed": (files.setup.seed, self.version, rows.task)} if getattr(model, "seeded", False) else {}
        loss = model.loss_and_grad(layout.views(self.weights), x, y, layout.views(files.grads[rows.task]),
                                   **seeded)  # overwrites every value
        if files.straggler > 1:
            time.sleep((files.straggler - 1) * (time.perf_counter() - started))
        files.seconds[update.batch, rows.task] = time.perf_counter() - started
        files.loss[update.batch, rows.task] = loss
        fault_point("after_grad_write")
        return math.isfinite(loss)

    # --- slot 0's bookkeeping ---

    def publish(self) -> None:
        """Rename the complete version into place, record it, and move the ledger past its update."""
        if self.unpublished is None:
            return
        update, self.unpublished = self.unpublished, None
        files = self.files
        files.board.doing(self.slot, self.generation, PUBLISH, update.update)
        checksum = weights_checksum(files.digests, files.size)
        self.record(update, PUBLISHED)
        files.records["checksum"][update.batch] = np.frombuffer(bytes.fromhex(checksum.split(":")[1]), np.uint8)
        commit_weights(building_path(files.run_dir, self.version, files.server_pid), files.run_dir, self.version)
        fault_point("after_publish")
        files.board.set_ledger(Ledger(self.generation, update.update, self.version))

    def skip(self, update: Update, bad: tuple[int, ...] | list[int]) -> None:
        """An update whose gradients or step came out non-finite: the version stays where it is."""
        if self.slot == 0:
            self.record(update, SKIPPED)
            for task in bad:
                self.files.bad[update.batch, task] = LOSS_NONFINITE
            self.files.board.set_ledger(Ledger(self.generation, update.update, self.version))
        if self.files.setup.on_nonfinite == "stop":
            raise NonfiniteStop

    def record(self, update: Update, status: int) -> None:
        row = self.files.records[update.batch]
        row["status"], row["version"], row["time"] = status, self.version, time.time()
        row["participants"] = self.stretch.participants
        self.files.bad[update.batch] = 0
