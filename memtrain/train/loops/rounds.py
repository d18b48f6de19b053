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
2. **gradients** of ``update``: each of my tasks, at that version, into the task's buffer (the server alone:
   one after the other, or at once on its task threads, train/loops/threads.py: ``stretch.threads``). Slot 0 (the
   publisher) then publishes the new version (a rename) and records it; every participant marks its
   gradients; the last slot (the readier; slot 0 too when it is alone) then readies the file of the
   version after it and marks ready. Wait until every participant has marked, and ready.

The overlap: nobody waits for the server, and the bookkeeping runs while peers are still computing
(between a participant's own marks and its own wait), split between two participants so that neither
carries all of it. Two meetings per update, at marks (train/exchange/marks.py); the server only watches the
board, the processes and the clock.

The server alone, synchronous (``stretch.private``), has no peer to meet: it writes no marks and waits for
none (each would read back its own), keeping only its activity words (what a failure reports it was doing)
and the ledger; whether a step or a task came out finite it knows itself.

Fixed staleness k >= 1 (``train.staleness``, in the rounds by default): the gradients of an update are
computed at the version of k updates earlier (plan.gradient_base), complete already, so a participant
goes from its step slice straight to its gradients and the step's marks are waited for at the
gradients' meeting: one meeting per update. Gradient buffers and block digests alternate between two
banks, so a fast participant never overwrites what a slow one still reads; right after each meeting
slot 0 publishes the new version, recycling the oldest one kept just before the rename (``ready``).

Non-finite: a task whose loss is NaN/Inf marks itself so; everyone sees it at the meeting and the
update is skipped (no step; its next update is computed at the same version). A step slice that comes
out non-finite is marked so too; the new version is void and the update is skipped the same way. With
``train.on_nonfinite = "stop"`` every participant ends the stretch there instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from memtrain.faults import fault_point
from memtrain.train.exchange.marks import (
    GRADIENT,
    LOSS_NONFINITE,
    PUBLISH,
    PUBLISHED,
    READYING,
    SKIPPED,
    STEP,
    WAITING,
    Cancelled,
    Ledger,
)
from memtrain.train.exchange.weights import (
    BLOCK,
    commit_weights,
    weights_digest,
)
from memtrain.train.loops.mapped import DROP_DELETED_EVERY, RoundFiles
from memtrain.train.loops.reduce import reduce_and_step
from memtrain.train.loops.threads import TaskThreads
from memtrain.train.messages import Outcome, Stretch
from memtrain.train.optim import learning_rate
from memtrain.train.plan import (
    TaskRange,
    Update,
    gradient_bank,
    step_slices,
    task_owner,
)
from memtrain.train.schedule import Planned
from memtrain.train.timing import UNTIMED, Timer, timed, timed_sections


class NonfiniteStop(Exception):
    """An update came out non-finite and the job says to stop there."""


class Participant:
    """One slot's part in one stretch: the loop, and the pieces of a round it is made of."""

    def __init__(self, files: RoundFiles, stretch: Stretch, *, alive: Callable[[], None],
                 chores: Callable[[], bool] | None = None, timer: Timer = UNTIMED):
        self.files, self.stretch, self.alive, self.chores = files, stretch, alive, chores
        timed_sections(self, timer, ("round", "ready", "publish"))  # train/timing.py: untimed, nothing
        self.reduce_and_step = timed(timer, "step", reduce_and_step)
        self.generation, self.slot = stretch.generation, stretch.slot
        self.staleness = files.setup.staleness
        self.planned = Planned(staleness=self.staleness)  # the schedule: the version each update's gradients read
        self.version = stretch.version  # the newest complete version (the next step's parent)
        self.weights = files.weights(stretch.version)  # ... mapped
        self.bases = dict(stretch.bases)  # fixed staleness: updates done -> the version then (plan.gradient_base)
        slices = step_slices(files.size, stretch.slices, BLOCK)
        self.slice = slices[self.slot] if self.slot < len(slices) else None
        self.unpublished: Update | None = None  # slot 0: an update whose version is complete, not yet renamed
        self.computed_at: dict[int, int] = {}  # slot 0: update -> the version its gradients were computed at
        # the last slot: the version whose file it readied last; the server readied the stretch's first one
        # (engines.Rounds.run), so the first round does not check that file again
        self.readied = stretch.version + 1
        self.out: np.ndarray | None = None  # the file of the version the last step wrote, mapped
        self.threads: TaskThreads | None = None  # the server's task threads, during ``run`` (stretch.threads > 1)
        # the server alone (stretch.private, synchronous): version n is stepped into the ring's file n % ring, the
        # newest ``keep`` of them and the one being stepped; only the stretch's newest are published, at its end
        self.private = stretch.private and not self.staleness
        self.ring = files.keep + 1
        self.rings: dict[int, np.ndarray] = {}  # the ring's files readied in this stretch, mapped
        self.ring_left: int | None = None  # the oldest version left on disk, once a ring file was readied
        self.recorded = stretch.version  # slot 0: the newest version recorded (the ledger's)

    def run(self) -> Outcome:
        """The stretch's rounds, on ``stretch.threads`` task threads (train/loops/threads.py), stopped at its end."""
        if self.stretch.threads < 2:
            return self.loop()
        for thread in range(1, self.stretch.threads):
            self.files.reader(thread)  # made here: a helper thread never changes the files' dicts
        self.threads = TaskThreads(self.stretch.threads)
        try:
            return self.loop()
        finally:  # a stop, a fault or an error too: no helper outlives its stretch
            self.threads.close()
            self.threads = None

    def loop(self) -> Outcome:
        updates = self.files.plan.updates(self.stretch.epoch)[self.stretch.first:self.stretch.stop]
        try:
            return self.rounds(updates)
        finally:  # however the stretch ends: the next one, an evaluation, a checkpoint or a resume reads the files
            if self.private:
                self.publish_ring()

    def rounds(self, updates: list[Update]) -> Outcome:
        try:
            pending = None
            for update in updates:
                pending = self.round(step=pending, grads=update)
                if self.chores is not None and self.chores():  # the server's chores, when it runs the loop
                    break
            self.round(step=pending, grads=None)  # the stretch's last step: evaluation needs its version
        except Cancelled:
            return Outcome.CANCELLED
        except NonfiniteStop:
            return Outcome.NONFINITE
        return Outcome.DONE

    def round(self, *, step: Update | None, grads: Update | None) -> Update | None:
        """Step ``step`` into the next version, then compute ``grads``; returns ``grads`` unless it was skipped
        (its step is then the next round's).

        Synchronous, the gradients need the new version: everyone meets after the step and after the
        gradients. With fixed staleness k >= 1 they are computed at a version that is complete already, so
        the step's meeting is folded into the gradients' one: one meeting per update."""
        if step is not None:
            self.step(step)
        if grads is None:
            if self.staleness and step is not None:
                self.files.board.doing(self.slot, self.generation, WAITING, step.update)
                self.settle(step, self.files.board.wait_step(self.generation, step.update, self.stretch.participants,
                                                             self.alive))
            self.publish()  # nothing left to overlap the publication with
            return None
        return self.gradients(grads, stepped=step)

    # --- 1. the step ---

    def step(self, update: Update) -> None:
        files, board = self.files, self.files.board
        # mapped now: once met, slot 0 may rename it any time
        out = self.out = self.ring_file(self.version + 1) if self.private else files.building(self.version + 1)
        finite = True
        if self.slice is not None:
            board.doing(self.slot, self.generation, STEP, update.update, self.slot)
            parity = self.version % 2
            lo, hi = self.slice
            finite = self.reduce_and_step(grads=self.gradient_buffers(update), rows=update.rows, weights=self.weights,
                                     state_in=files.state[parity], weights_out=out, state_out=files.state[1 - parity],
                                     lo=lo, hi=hi, optimizer=files.optimizer, step=self.version + 1,
                                     lr=learning_rate(files.optimizer, update.update, files.plan.total_updates),
                                     digests=files.digests[(self.version + 1) % 2],
                                     trainable=files.context.layout.trainable, scratch=files.scratch)
        if self.private:  # alone: nobody to meet (a mark and a wait would read back its own mark)
            self.settle(update, finite)
            return
        board.mark_step(self.generation, update.update, self.slot, finite)
        if self.staleness:
            return  # met at the next gradients' meeting
        board.doing(self.slot, self.generation, WAITING, update.update)
        self.settle(update, board.wait_step(self.generation, update.update, self.stretch.participants, self.alive))

    def settle(self, update: Update, finite: bool) -> None:
        """Everyone's slice of ``update``'s step is written: the new version is complete, or void if a slice
        came out non-finite (nobody reads it; the next step overwrites it)."""
        if not finite:
            self.skip(update, ())
            return
        self.weights, self.version = self.out, self.version + 1
        if self.slot == 0:
            self.unpublished = update
        self.done(update)
        if update.update % DROP_DELETED_EVERY == 0:
            self.files.maps.drop_deleted()

    def done(self, update: Update) -> None:
        """Fixed staleness: note the version after ``update`` (published or skipped) for the later gradients."""
        if self.staleness:
            self.bases[update.update + 1] = self.version
            self.bases.pop(update.update - self.staleness, None)  # no later update reads it (plan.live_bases)

    def gradient_buffers(self, update: Update) -> list[np.ndarray]:
        """The update's gradients, in task order (train/loops/stream.py reads them from files workers sent)."""
        bank = self.files.grads[gradient_bank(update.update, self.staleness)]
        return [bank[t.task] for t in update.tasks]

    # --- 2. the gradients ---

    def gradients(self, update: Update, *, stepped: Update | None = None) -> Update | None:
        """``update``'s gradients, at the new version (or with fixed staleness at plan.gradient_base's),
        then the meeting; ``stepped``: the update whose step this round began with (fixed staleness meets it
        here)."""
        files, board = self.files, self.files.board
        at = self.bases[self.planned.at(update.update)] if self.staleness else self.version
        weights = self.weights if at == self.version else files.weights(at)
        mine = [rows for rows in update.tasks if task_owner(rows.task, self.stretch.participants) == self.slot]
        finite = all(self.compute(update, mine, weights, at))  # every task computed, finite or not
        if self.slot == 0:  # before its mark: once everyone has met, the next step rewrites the digests it reads
            self.computed_at[update.update] = at
            self.publish()
        if self.private:  # alone: nobody to meet, and each step finds its ring's file (``ready``)
            return self.after_gradients(update, finite)
        board.mark_gradients(self.generation, update.update, self.slot, finite)
        if self.staleness:
            if self.slot == 0:  # the next step's file was readied after the last meeting (``ready``)
                board.mark_ready(self.generation, update.update)
        elif self.slot == self.stretch.participants - 1:  # the readier: slot 0 too when it is alone
            self.ready(self.version + 1, update)
            board.mark_ready(self.generation, update.update)
        board.doing(self.slot, self.generation, WAITING, update.update)
        if self.staleness and stepped is not None:
            step_finite, finite = board.wait_both(self.generation, step=stepped.update, grads=update.update,
                                                  participants=self.stretch.participants, alive=self.alive)
            self.settle(stepped, step_finite)
        else:
            finite = board.wait_gradients(self.generation, update.update, self.stretch.participants, self.alive)
        if self.staleness and self.slot == 0:  # right away: the ledger passes ``stepped`` before ``update`` is skipped
            if self.unpublished is not None:
                self.publish()  # readies the file of the step after next too
            else:
                self.ready(self.version + 2, update)
        return self.after_gradients(update, finite)

    def after_gradients(self, update: Update, finite: bool) -> Update | None:
        """``update`` to step next, or None once it is skipped (a task's loss came out non-finite: ``finite``)."""
        if not finite:
            losses = self.files.loss[update.batch, :len(update.tasks)]
            self.skip(update, np.flatnonzero(~np.isfinite(losses)).tolist())
            return None
        return update

    def ring_file(self, version: int) -> np.ndarray:
        """The ring's file that ``version`` is stepped into, mapped: readied once per stretch (the last ones the
        stretch before published were renamed away), then the same file every ``ring`` updates."""
        ring = version % self.ring
        out = self.rings.get(ring)
        if out is None:  # the stretch's first readying lists the folder, the later ones retire from where it left
            out, self.ring_left = self.files.ready_private(version, ring, left_from=self.ring_left)
            self.rings[ring] = out
        return out

    def ready(self, version: int, update: Update) -> None:
        """Make the file of ``version`` ready for its step, retiring (recycling) the oldest version kept.

        Synchronous, the readier (the last slot) readies the next step's file while its peers compute.
        With fixed staleness slot 0 readies the file of the step after next as it publishes a version,
        after recording it and before renaming it: a worker's death restarts the stretch from the newest
        version recorded, whose k older versions must still be there (the server completes a rename its
        publisher died before: Logbook.catch_up), and no more than k + 1 are ever published. The server alone
        (``private``) readies nothing here: each step finds its ring's file (``ring_file``)."""
        if self.private:
            return
        if self.readied != version:  # a skipped update asks for the same file again
            self.files.board.doing(self.slot, self.generation, READYING, update.update)
            self.files.ready_building(version)
            self.readied = version

    def compute(self, update: Update, tasks: list[TaskRange], weights: np.ndarray, at: int) -> list[bool]:
        """``tasks``' gradients at version ``at``, one after the other or on the task threads; whether each
        came out finite, in task order."""
        if self.threads is None or len(tasks) < 2:
            return [self.gradient(update, rows, weights, at) for rows in tasks]
        files = self.files
        files.board.doing(self.slot, self.generation, GRADIENT, update.update, tasks[0].task)
        bank = files.grads[gradient_bank(update.update, self.staleness)]
        jobs = [partial(self.gradient, update, rows, weights, at, views=(files.views(weights),
                                                                         files.views(bank[rows.task])))
                for rows in tasks]
        return self.threads.run(jobs)

    def gradient(self, update: Update, rows: TaskRange, weights: np.ndarray, at: int, thread: int = 0, *,
                 views: tuple[dict[str, np.ndarray], dict[str, np.ndarray]] | None = None) -> bool:
        """One task's gradient at version ``at`` (mapped: ``weights``) into its buffer; False if its loss is
        not finite. On a task thread: ``thread`` its index, ``views`` the weights' and the buffer's views, made
        by the caller (``compute``), which marks the activity."""
        files = self.files
        if views is None:
            files.board.doing(self.slot, self.generation, GRADIENT, update.update, rows.task)
            out = files.grads[gradient_bank(update.update, self.staleness)][rows.task]
            views = files.views(weights), files.views(out)
        x, y = files.rows(update.epoch, rows, thread=thread)
        loss, files.seconds[update.batch, rows.task] = files.gradient(weights, views[0], x, y, views[1], version=at,
                                                                      task=rows.task)
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
        files.columns["checksum"][update.batch] = np.frombuffer(weights_digest(files.digests[self.version % 2],
                                                                              files.size), np.uint8)
        self.record(update, PUBLISHED)  # from here the file is as good as published (Logbook.catch_up)
        if not self.private:  # else its digest, recorded, is the version's proof; its file waits in the ring
            if self.staleness:
                self.ready(self.version + 2, update)  # recycles the oldest version, before the newest is added
                fault_point("mid_publish")
            commit_weights(files.building_path(self.version), files.run_dir, self.version)
        fault_point("after_publish")
        files.board.set_ledger(Ledger(self.generation, update.update, self.version))
        self.recorded = self.version

    def publish_ring(self) -> None:
        """The stretch's end, the server alone: rename its newest recorded versions (the newest ``keep``, oldest
        first) from the ring into place, leaving on disk what publishing every version would have left. The
        ring holds them intact: a step writes version n + 1 into file (n + 1) % ring, never one of the ``keep``
        recorded before it, and a version's bytes are never changed once recorded."""
        newest = self.recorded
        for version in range(max(self.stretch.version + 1, newest - self.files.keep + 1), newest + 1):
            ring = version % self.ring
            commit_weights(self.files.private_path(ring), self.files.run_dir, version)
            self.files.published_ring(ring)
            del self.rings[ring]

    def skip(self, update: Update, bad: tuple[int, ...] | list[int]) -> None:
        """An update whose gradients or step came out non-finite: the version stays where it is."""
        if self.slot == 0:
            self.record(update, SKIPPED)
            for task in bad:
                self.files.bad[update.batch, task] = LOSS_NONFINITE
            self.files.board.set_ledger(Ledger(self.generation, update.update, self.version))
        self.done(update)
        if self.files.setup.on_nonfinite == "stop":
            raise NonfiniteStop

    def record(self, update: Update, status: int) -> None:
        """How ``update`` ended, into its record; the status last (the server trusts a record by it)."""
        column, row = self.files.columns, update.batch
        column["version"][row], column["time"][row] = self.version, time.time()
        column["at"][row] = self.computed_at.pop(update.update, self.version)
        column["participants"][row] = self.record_participants(update)
        column["bad"][row] = 0
        column["status"][row] = status

    def record_participants(self, update: Update) -> int:
        """How many computed the update's tasks side by side: the slots, or the server's task threads (which
        share them as slots do, job ``i`` on thread ``i % threads``): the record's compute is the busiest's."""
        return self.stretch.participants * self.stretch.threads
