"""A streamed gradient task -> a gradient file of its own name: a worker's part when participants cannot meet.

The round (train/loops/rounds.py) has every participant meet at marks in a shared file. Workers on other
machines cannot: a network filesystem gives close-to-open consistency, not a coherent shared map. So
on a cluster the server runs the round's loop alone (one participant, the in-memory board: train/loops/sliced.py's
``SlicedParticipant``, which also slices the step) and only the gradients leave it, as messages:

1. **step**: the server steps the whole parameter vector (train/loops/reduce.py: the same sums in the same
   task order, the same optimizer) from the gradient files of the update; while the next update's
   tasks compute, it renames them to spares (``g-sU-tT-aA.npy``) and readies the next version's file;
2. **publish** the new version (a rename that never replaces), synced where the filesystem needs it,
   *before* any message names it: a file is read on another machine only after its writer closed (and
   synced) it and a message said so;
3. **gradients**: one ``GradTask`` per task of the next update, at that version, through any Transport
   (``Scheduler.run``: a dead worker's task re-runs under a new attempt number, into a new file). Each
   worker writes its gradient into the spare its task names (or a new file if it is gone), renames it
   ``g-uU-tT-aA.npy`` (``StreamedGradient``: no name is reused in a run), closes (and syncs) it, then answers
   with the loss and the compute time, which the server writes into the round's records.

Same files, same arithmetic, same order of additions as the fused round: the weights are bitwise
identical to a local run of the job, whatever the number of workers or the deaths on the way.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from memtrain.errors import Interrupted, MemtrainError
from memtrain.faults import fault_point
from memtrain.files import npy_header_bytes, open_reused, writing_npy_rows
from memtrain.layout import weights_path
from memtrain.train.exchange.area import STREAMED_GRADIENT
from memtrain.train.messages import GradTask, Outcome, Result

if TYPE_CHECKING:
    from memtrain.models.params import ParamLayout
    from memtrain.stopping import StopRequest
    from memtrain.train.loops.gradient import TaskGradient
    from memtrain.train.loops.mapped import RoundFiles
    from memtrain.train.loops.maps import MapCache



class MappedBytes:
    """Bytes this process's tasks read through maps of the run's and the exchange's files: the weights a gradient
    reads, the slices a step reads (train/loops/sliced.py). /proc/PID/io's ``rchar`` counts read calls, not pages read
    through a map, so the cluster benchmark (memtrain/benchmarks/cluster_costs.py) adds this count."""

    read = 0


class StreamedGradient:
    """A worker's part of a streamed gradient task: the gradient of a task's rows at the version it names, into a
    new file of its own name. ``rows(epoch, lo, hi)``: a task's rows, normalized (the worker's ``TaskRows``);
    ``gradient``: this process's loss and gradient (train/loops/gradient.py); ``maps``: its maps kept between tasks."""

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
        path = STREAMED_GRADIENT.path(self.exchange, message.ticket, message.task, message.attempt)
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
        gone (an attempt of the task that died after renaming it). Maps are kept by inode (train/loops/maps.py) and
        spares are recycled, so the pages are mapped already. One machine only: across machines a map's writes
        are not what another machine's open reads (close-to-open), so a cluster run's tasks never ask for it."""
        try:
            return self.maps.get(self.exchange / message.spare, (self.layout.size,), np.float32, "r+")
        except (FileNotFoundError, MemtrainError):
            return None


class ServerGradients:
    """The server computing its own streamed gradients (no worker process: ``train.workers = 0``, or none paying
    for itself): each task computed here, by the worker's part above, the moment it is submitted, into the same
    files with the same arithmetic; no transport, no scheduler, no message in between (as the rounds run
    alone, train/loops/rounds.py). What the server's loop (train/loops/overlap.py) asks of a stream, as the
    scheduler's ``TaskStream`` answers it for worker processes: ``submit``, ``free``, ``in_flight``, ``wait``,
    in the same order (one slot: a schedule that asks ``free`` has one task in flight at a time).

    ``files``: the server's round files (its maps, its rows, its gradient function); ``stop``: the run's stop
    request (``wait`` raises Interrupted once it is asked, as the scheduler's does); ``failed(task, exc)``: the
    error that stops the run when a task raises (the scheduler's words for a worker's failure)."""

    def __init__(self, files: RoundFiles, *, stop: StopRequest,
                 failed: Callable[[GradTask, BaseException], Exception]):
        self.stop, self.failed = stop, failed
        self.maps, self.plan, self.reader = files.maps, files.plan, files.reader(0)  # the rounds' own, shared
        self.compute = StreamedGradient(layout=files.context.layout, maps=files.maps, run_dir=files.run_dir,
                                        exchange=files.exchange, rows=self.rows, gradient=files.gradient)
        self.results: list[tuple[GradTask, Result]] = []  # computed, not taken yet by ``wait``

    def rows(self, epoch: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """A task's rows (``Plan.rows``), normalized: the server's own reader, the rounds' too."""
        return self.reader.get(self.plan.rows(epoch, lo, hi))

    def submit(self, task: GradTask) -> None:
        self.maps.drop_deleted()  # as a worker does before each message: no map of a deleted file kept
        try:
            with np.errstate(all="ignore"):  # a non-finite result is detected and logged, not warned about
                result = self.compute(task)
        except BaseException as exc:  # noqa: BLE001 - the user's model may raise anything: the run stops, quoting it
            raise self.failed(task, exc) from None
        self.results.append((task, result))

    @property
    def in_flight(self) -> int:
        """Tasks computed whose results were not taken yet."""
        return len(self.results)

    def free(self) -> int:
        """1 when no result waits to be taken: the server is its own one worker."""
        return 0 if self.results else 1

    def wait(self) -> list[tuple[GradTask, Result]]:
        """The results computed since the last call, in the order computed. Raises Interrupted on a stop signal."""
        results, self.results = self.results, []
        for _ in results:
            fault_point("after_result")  # where the scheduler passes it for each result it takes
        if self.stop.requested:
            raise Interrupted("stopped by a signal")
        return results


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

