"""The step of a cluster run, sliced across the Dask workers: the round's sliced step, met through messages.

On one machine the round's participants step slices of the next version and meet at marks in a shared
file (train/loops/rounds.py). Workers on other machines cannot meet that way (docs/cluster.md: close-to-open
consistency, no coherent shared maps), so on a cluster the slices are tasks, and the meetings are the
server's waits for their answers. One update, from version v:

1. **gradients** (train/loops/stream.py): one ``GradTask`` per task of the update, at v; each worker writes its
   gradient into a file of its own (synced where needed), then answers;
2. **step**: one ``StepTask`` per slice [lo, hi) of the parameters (``plan.step_slices``, as many as
   there are workers; the slicing never changes a bit: the step is elementwise). Each worker opens v's
   file, the optimizer state of v and every gradient file of the update afresh (after the answers that
   said they are closed), reduces its slice of the gradients in task order (train/loops/reduce.py, the same
   sums as the round), steps it, and writes the slice with ``pwrite`` at its place into the next
   version's unpublished file and into the optimizer state's new files (``layout.state_building_name``:
   a new file per version, never rewritten for another one); syncs them where needed; answers with the
   slice's block digests (16 bytes per 64 Ki parameters) and whether it came out finite;
3. **publish**: the server writes the digests into the block digests file, renames the state's new
   files over the parity buffers (``state_buffer_name(name, (v + 1) % 2)``, what checkpoints copy),
   records the update with the version's checksum and renames the version into place (a rename that
   never replaces), then sends the next update's gradient tasks, naming it.

The server handles records only: file names, integers, digests. It never reads or writes a parameter.

On a Dask cluster the two waits go through a broadcast round (memtrain/cluster/broadcast.py): one record
posted per wait, whatever the number of workers, each worker taking the tasks and the slice its rank in
the round names (``tasks[rank::N]``, ``step_slices(size, N, BLOCK)[rank]``), and one count awaited. An
update whose round ends early (a worker left, failed, straggled or fell silent) is completed through the
per-task path above (``Scheduler.run``), which this module also runs when there is no round.

Faults: a step task is pure -- its inputs are files nobody writes any more, its outputs a fixed byte
range of files that only the same slice of the same step writes, always with the same bits. A worker
that dies holding a slice has it redone by another (``Scheduler.run``); what it half-wrote is
overwritten before anything reads it (nothing is read before every slice answered). A straggler's
backup copy (docs/cluster.md, "Stragglers") writes the same bits over the same range: the loser's
late writes change no byte, and once the files are renamed it cannot open them by their old names.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from memtrain.errors import MemtrainError
from memtrain.files import allocate_npy, check_npy, npy_header_bytes, open_npy
from memtrain.layout import building_path, weights_path
from memtrain.train.exchange.area import OPTIMIZER_STATE, SPARE_GRADIENT, STATE_BUILDING, STREAMED_GRADIENT, discard
from memtrain.train.exchange.weights import BLOCK, ready_building
from memtrain.train.loops.mapped import RoundFiles
from memtrain.train.loops.reduce import Scratch, reduce_and_step
from memtrain.train.loops.rounds import Participant
from memtrain.train.loops.stream import MappedBytes
from memtrain.train.messages import GradTask, Outcome, Result, StepTask, Stretch
from memtrain.train.optim import learning_rate, state_names
from memtrain.train.plan import Update, step_slices
from memtrain.train.timing import UNTIMED, Timer, timed, timed_sections

if TYPE_CHECKING:
    from memtrain.cluster.broadcast import Answer, Broadcast
    from memtrain.models.params import ParamLayout
    from memtrain.train.loops.node_sum import KeptSum
    from memtrain.train.optim import OptimizerConfig

DIGEST_BYTES = 16  # files.block_digest
FINISH_SECONDS = 30.0  # at a stretch's end, the longest the server waits for the round's loops to return
PAGE_FLOATS = 4096 // 4  # float32 values per page: one write each maps every page of a new version's file
RunTasks = Callable[[list, Callable[[], None]], list[Result]]  # tasks (gradients, slices), the server's chores


class SliceStep:
    """A worker's part of a cluster's step: slice [lo, hi) of version ``message.version`` + 1 and its optimizer
    state. Its new weights and optimizer state are computed in the worker's own memory (kept between steps)
    and written to the shared files with ``pwrite``, never through a shared map, so that only the slice's own
    bytes leave the machine (a map's dirty page at a slice's edge would carry a neighbour's bytes too)."""

    def __init__(self, *, layout: ParamLayout, optimizer: OptimizerConfig, server_pid: int, run_dir: Path,
                 exchange: Path, kept: KeptSum | None = None):
        self.layout, self.optimizer, self.server_pid = layout, optimizer, server_pid
        self.run_dir, self.exchange = run_dir, exchange
        self.kept = kept  # a two-level round: the segments of the last partial this node wrote for its own slice
        self.state_names = state_names(optimizer)
        self.memory: tuple[np.ndarray, dict[str, np.ndarray]] | None = None
        self.scratch = Scratch()

    def __call__(self, message: StepTask) -> Result:
        size, names, exchange = self.layout.size, self.state_names, self.exchange
        lo, hi = message.lo, message.hi
        weights = open_npy(weights_path(self.run_dir, message.version), shape=(size,), dtype=np.float32)
        grads = [open_npy(STREAMED_GRADIENT.path(exchange, message.update, task, attempt), shape=(size,),
                          dtype=np.float32)[lo:hi] for task, attempt in enumerate(message.attempts)
                 if task >= message.chained]
        if message.chained:  # a two-level round: the fold of the first tasks continued, its partial read
            from memtrain.train.loops.node_sum import chained_sum

            grads.insert(0, chained_sum(message, exchange, size, self.kept))
        parity = message.version % 2
        state_in = {name: open_npy(OPTIMIZER_STATE.path(exchange, name, parity), shape=(size,),
                                   dtype=np.float32)[lo:hi] for name in names}
        MappedBytes.read += (len(grads) + 1 + len(names)) * (hi - lo) * 4
        out, state_out = self.buffers(hi - lo)
        digests = np.zeros((-(-(hi - lo) // BLOCK), DIGEST_BYTES), dtype=np.uint8)
        trainable = self.layout.trainable
        if not reduce_and_step(grads=grads, rows=message.rows, weights=weights[lo:hi], state_in=state_in,
                               weights_out=out, state_out=state_out, lo=0, hi=hi - lo, optimizer=self.optimizer,
                               step=message.version + 1, lr=message.lr, digests=digests,
                               trainable=None if trainable is None else trainable - lo, scratch=self.scratch):
            return Result(task=message.task, attempt=message.attempt, outcome=Outcome.NONFINITE)
        sync = sync_needed(exchange)
        write_slice(building_path(self.run_dir, message.version + 1, self.server_pid), lo, out, size, sync)
        for name in names:
            write_slice(STATE_BUILDING.path(exchange, name, message.version + 1), lo, state_out[name], size, sync)
        return Result(task=message.task, attempt=message.attempt, outcome=Outcome.DONE, rows=hi - lo,
                      digests=digests.tobytes())

    def buffers(self, length: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """The slice's new weights and optimizer state, kept between steps of the same length."""
        if self.memory is None or self.memory[0].size != length:
            self.memory = (np.empty(length, dtype=np.float32),
                           {name: np.empty(length, dtype=np.float32) for name in self.state_names})
        return self.memory


@functools.cache
def sync_needed(exchange: Path) -> bool:
    """Whether a file written here must be synced before a worker on another machine may read it."""
    from memtrain.cluster.sharedfs import needs_sync

    return needs_sync(exchange)


def write_slice(path: Path, lo: int, values: np.ndarray, size: int, sync: bool) -> None:
    """Write ``values`` as elements [lo, lo + len) of the .npy vector ``path`` (made whole by the server), then
    sync it if ``sync`` and close it."""
    fd = os.open(path, os.O_WRONLY)  # never created here: a late copy finds a renamed file gone
    try:
        data = memoryview(values).cast("B")
        at = len(npy_header_bytes((size,), np.dtype(np.float32))) + lo * values.itemsize
        while data:  # pwrite may write less than asked
            done = os.pwrite(fd, data, at)
            data, at = data[done:], at + done
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


class SlicedParticipant(Participant):
    """The server of a cluster run, the round's only participant (train/loops/rounds.py's loop, run alone): each
    update's gradients are tasks sent to the workers (``run_tasks``, train/loops/stream.py's ``StreamedGradient``
    on their side), its step is one task per slice (``SliceStep``), and the server publishes.

    ``workers``: how many run the tasks at once (the records' ``participants``: the logbook times an
    update's compute as its busiest worker's). ``slices``: how many slices to cut the next step into (the
    workers present; any count gives the same bits). ``publish_sync``: makes a published version readable
    on other machines (an fsync on a network filesystem, nothing on a local one). ``recycle``: whether a
    retired version's file may be rewritten as a later one -- not when a worker on another machine may
    still hold a map of it. ``broadcast``: the broadcast rounds (memtrain/cluster/broadcast.py); None: per
    task only.
    """

    def __init__(self, files: RoundFiles, stretch: Stretch, *, run_tasks: RunTasks, workers: Callable[[], int],
                 slices: Callable[[], int], publish_sync: Callable[[Path], None], recycle: bool,
                 chores: Callable[[], bool] | None = None, broadcast: Broadcast | None = None,
                 timer: Timer = UNTIMED):
        super().__init__(files, stretch, alive=lambda: None, chores=chores, timer=timer)
        timed_sections(self, timer, ("step", "file_chores"))  # train/timing.py: untimed, nothing
        self.run_tasks, self.workers, self.slices = timed(timer, "tasks", run_tasks), workers, slices
        self.publish_sync, self.recycle, self.broadcast = publish_sync, recycle, broadcast
        self.received: list[tuple[Path, str]] = []  # the gradient files of the update to step next, spare names
        self.stepped: list[tuple[Path, str]] = []  # those of the update stepped last, and their spare names
        self.spares: list[str] = []  # names of stepped gradient files, for the next tasks to rewrite
        self.attempts: list[int] = []  # the attempt of each task of the update to step next, in task order
        self.state_names = state_names(files.optimizer)  # the optimizer's state vectors, stepped in slices

    def run(self) -> Outcome:
        try:
            with np.errstate(all="ignore"):  # non-finite results are detected and reported, not warned about
                return super().run()
        finally:
            self.discard_received()
            discard([self.files.exchange / name for name in self.spares])
            self.spares = []
            if self.broadcast is not None:
                self.broadcast.finish(FINISH_SECONDS)
            self.discard_state(self.version + 1)

    # --- 1. the gradients: tasks out, through the broadcast round or per task ---

    def gradients(self, update: Update, *, stepped: Update | None = None) -> Update | None:
        files = self.files
        self.publish()  # the version the tasks name is published (and synced) before any message names it
        spares, self.spares = self.spares[:len(update.tasks)], self.spares[len(update.tasks):]
        spares += [""] * (len(update.tasks) - len(spares))
        tasks = [GradTask(task=rows.task, attempt=0, ticket=update.update, version=self.version, epoch=update.epoch,
                          lo=rows.lo, hi=rows.hi, spare=spare)
                 for rows, spare in zip(update.tasks, spares, strict=True)]
        self.computed_at[update.update] = self.version
        results = self.run_gradient_tasks(tasks)
        discard([files.exchange / spare for spare in spares if spare])  # one a worker did not take (a retry)
        self.attempts = [r.attempt for r in results]  # task t's gradient file is attempt attempts[t]'s
        self.received = [(STREAMED_GRADIENT.path(files.exchange, update.update, r.task, r.attempt),
                          SPARE_GRADIENT.name(update.update, r.task, r.attempt)) for r in results]
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
        """Through the broadcast round when there is one (one record out, one count back); an update whose
        round ended early (a worker left, failed, straggled or fell silent: ``Broadcast``) is completed per task: the
        tasks answered are kept, the others run again under attempt 1 (a new file: their first attempt's
        may still be written by a late loop; deleted once that loop ended), with retries and backups."""
        broadcast = self.broadcast
        if broadcast is None or not (broadcast.active or broadcast.open()):
            return self.run_tasks(tasks, self.file_chores)
        from memtrain.cluster.broadcast import gradient_record, gradient_results

        answer = broadcast.ask("grads", gradient_record(tasks), len(tasks), self.file_chores)
        found = gradient_results(tasks, answer.numbers)
        if answer.status == "done":
            return [found[task.task] for task in tasks]
        missing = [replace(task, attempt=1, spare="", in_place=False) for task in tasks if task.task not in found]
        self.round_over(answer, f"{len(missing)} of {len(tasks)} gradient tasks",
                        [STREAMED_GRADIENT.path(self.files.exchange, t.ticket, t.task, 0) for t in missing])
        done = {r.task: r for r in self.run_tasks(missing, lambda: None)}
        return [found.get(task.task) or done[task.task] for task in tasks]

    def run_step_tasks(self, tasks: list[StepTask], ranges: list[tuple[int, int]]) -> list[Result]:
        """Through the round the update's gradients went through, if it is still on; else (or if it ends
        now) every slice per task: a slice is pure, rewriting it writes the same bits."""
        broadcast = self.broadcast
        if broadcast is None or not broadcast.active:
            return self.step_per_task(tasks)
        from memtrain.cluster.broadcast import step_results

        answer = self.ask_step(broadcast, tasks, ranges)
        if answer.status == "done":
            if answer.joined:  # a worker joined: it takes part from the next round (``open`` gives it a slot)
                broadcast.close()
            return step_results(ranges, answer)
        self.round_over(answer, f"the step's {len(tasks)} slices", [])
        return self.step_per_task(tasks)

    def step_per_task(self, tasks: list[StepTask]) -> list[Result]:
        """The step's slices sent per task (no round, or its step wave ended early)."""
        return self.run_tasks(tasks, lambda: None)

    def ask_step(self, broadcast: Broadcast, tasks: list[StepTask], ranges: list[tuple[int, int]]) -> Answer:
        """The step's wave: its template; member j steps slice j (``step_slices``, as many as members)."""
        return broadcast.ask("step", replace(tasks[0], task=0, lo=0, hi=0), len(ranges), lambda: None)

    def step_ranges(self, count: int) -> list[tuple[int, int]]:
        """The slices of the next step, cut for ``count`` workers (any cut gives the same bits)."""
        return step_slices(self.files.size, count, BLOCK)

    def round_over(self, answer: Answer, what: str, leftovers: list[Path]) -> None:
        """A broadcast round ended before every answer was in: say why, kill its silent members (``timeout``),
        end it (the next update opens a new one)."""
        assert self.broadcast is not None
        why = {"left": "a worker of the round left the scheduler", "failed": f"a task failed: {answer.error}",
               "late": f"the last answers are late ({answer.waited:.2f} s; the straggler rule, docs/cluster.md)",
               "timeout": "no answer within train.task_timeout", "ended": "the round was ended"}[answer.status]
        how = ("run again per task (attempt 1: a backup copy, whichever finishes first is taken)"
               if answer.status == "late" else "run per task")
        self.broadcast.log(f"broadcast round of {self.broadcast.size} workers ended: {why}; {what} {how}")
        if answer.status == "timeout":
            self.broadcast.kill_silent(answer.ranks)
        self.broadcast.close(leftovers)

    # --- 2. the step: one task per slice ---

    def step(self, update: Update) -> None:
        try:
            finite = self.step_sliced(update)
        finally:
            self.stepped, self.received = self.received, []
        self.settle(update, finite)

    def step_sliced(self, update: Update) -> bool:
        """Every slice of ``update``'s step written (True), or one came out non-finite (False: nothing moves)."""
        files, version = self.files, self.version
        self.ready_state(version + 1)
        broadcast = self.broadcast
        count = broadcast.size if broadcast is not None and broadcast.active else max(1, self.slices())
        ranges = self.step_ranges(count)
        attempts = tuple(self.attempts)
        if [t.task for t in update.tasks] != list(range(len(attempts))):
            raise MemtrainError(f"update {update.update}: tasks {[t.task for t in update.tasks]} are not numbered "
                                "0, 1, ... in order", hint="this is a bug in memtrain: please report it")
        lr = learning_rate(files.optimizer, update.update, files.plan.total_updates)
        retried = tuple((task, attempt) for task, attempt in enumerate(attempts) if attempt)
        tasks = [StepTask(task=j, attempt=0, update=update.update, version=version, lo=lo, hi=hi, rows=update.rows,
                          lr=lr, tasks=len(attempts), retried=retried) for j, (lo, hi) in enumerate(ranges)]
        results = self.run_step_tasks(tasks, ranges)
        if any(result.outcome == Outcome.NONFINITE for result in results):
            self.discard_state(version + 1)
            return False
        digests = files.digests[(version + 1) % 2]
        for (lo, _), result in zip(ranges, results, strict=True):
            rows = np.frombuffer(result.digests, dtype=np.uint8).reshape(-1, DIGEST_BYTES)
            digests[lo // BLOCK: lo // BLOCK + len(rows)] = rows
        for name in self.state_names:  # the state of version + 1, where checkpoints and steps look
            os.replace(STATE_BUILDING.path(files.exchange, name, version + 1),
                       OPTIMIZER_STATE.path(files.exchange, name, (version + 1) % 2))
        self.out = None
        return True

    def ready_state(self, version: int) -> None:
        """The new files of ``version``'s optimizer state, whole (their space reserved), for the slice owners."""
        size = self.files.size
        for name in self.state_names:
            path = STATE_BUILDING.path(self.files.exchange, name, version)
            if path.exists():
                with contextlib.suppress(Exception):
                    check_npy(path, shape=(size,), dtype=np.float32)
                    continue
                discard([path])
            allocate_npy(path, (size,), np.float32)

    def discard_state(self, version: int) -> None:
        discard([STATE_BUILDING.path(self.files.exchange, name, version) for name in self.state_names])

    # --- 3. publication, records, the server's work while the workers compute ---

    def publish(self) -> None:
        if self.unpublished is None:
            return
        super().publish()
        self.publish_sync(weights_path(self.files.run_dir, self.version))

    def record_participants(self, update: Update) -> int:
        return max(1, min(self.workers(), len(update.tasks)))

    def file_chores(self) -> None:
        """The server's chores on files while the workers compute: the last step's gradient files become spares,
        the next version's files are made (their space reserved; the server writes none of their data)."""
        self.spare_stepped_and_ready_next()
        self.ready_state(self.version + 1)

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


