"""A job and its model -> the bytes every file of the run will take at its peak, in the exchange area and in
the run directory: what the start-up room check reserves, so that a run that starts never fills a disk by
its own doing.

Exchange area (deleted when the run ends):
- gradient buffers: one per task of an update (``T``), made at start and rewritten by every update
  (train/loops/rounds.py), so neither failures nor the worker count add any; two with fixed staleness
  (plan.gradient_banks);
- an additive model has neither gradient buffers nor optimizer state (no optimizer): its statistics are
  in the run directory (below);
- the optimizer state, double-buffered (2 per slot), the block digests (2 banks), the round records (one per update of
  an epoch) and the board the participants meet at.
- on a cluster (``run.cluster``, train/loops/stream.py), also a gradient file per task of two updates: those of
  the update just stepped are deleted while the next update's are written; and the optimizer state of the
  version being stepped, one new file per slot (train/loops/sliced.py), renamed over a parity buffer once written;
- in the overlapping modes (train/loops/overlap.py), the gradient files in flight, arrived and kept as spares:
  with fixed staleness k those of k + 2 updates; in async mode two per worker and two per gradient of a
  group. A stale, dead or superseded attempt's file is deleted at once.

Run directory:
- additive models: one partial statistics file (float64) per task, all alive until they are summed, and
  their sum (train/loops/additive.py); a killed or superseded attempt's file is removed at once
  (train/server/scheduler.py), so failures add nothing;
- weight versions: the ``keep_versions`` kept ones (at least the k + 1 a fixed staleness k reads, or the
  max_staleness + 1 of async mode) plus the one being built (and with fixed staleness in the rounds the
  one readied after it);
- checkpoints: ``keep_checkpoints`` plus the one being written before the oldest is pruned, each holding
  the weights and one file per optimizer slot (and, with fixed staleness k, up to k older versions).
The logs (metrics, lineage, events) grow by a few hundred bytes per update and are not counted.
"""

from __future__ import annotations

import resource
from dataclasses import dataclass

import numpy as np

from memtrain.config import Job
from memtrain.errors import InputError
from memtrain.files import DIGEST_BYTES
from memtrain.models.params import PARAM_DTYPE
from memtrain.train.context import ModelContext
from memtrain.train.exchange.marks import WORD, Board, records_dtype
from memtrain.train.exchange.weights import block_count
from memtrain.train.memory import size_text
from memtrain.train.optim import state_names
from memtrain.train.plan import gradient_banks

# Per file: the .npy header of a 1-D array (128 bytes; 4 KiB is ample) and the rounding up to whole pages.
FILE_OVERHEAD = 8192


@dataclass(frozen=True)
class Room:
    exchange: int  # bytes
    run: int

    def describe(self) -> str:
        return f"exchange {size_text(self.exchange)}, run directory {size_text(self.run)}"


def room_needed(job: Job, context: ModelContext, *, per_epoch: int, slots: int) -> Room:
    """The peak bytes of the run's files (see the module docstring for what is counted): ``per_epoch`` updates
    per epoch, ``slots`` participants at most."""
    weights = context.layout.size * PARAM_DTYPE.itemsize + FILE_OVERHEAD
    train = job.train
    tasks = train.tasks_per_update
    if context.additive:
        return additive_room(job, context, weights, per_epoch=per_epoch, slots=slots)
    states = len(state_names(job.train.optimizer))
    gradients = gradient_banks(train.staleness) * tasks * weights
    if job.run.cluster:
        gradients += 2 * tasks * weights + states * weights
    if train.mode == "async":
        gradients += 2 * (slots + train.async_group) * weights
    elif train.staleness:
        gradients += (train.staleness + 2) * tasks * weights
    small = (2 * block_count(context.layout.size) * DIGEST_BYTES + per_epoch * records_dtype(tasks).itemsize
             + Board(slots).size * WORD.itemsize + 3 * FILE_OVERHEAD)
    exchange = gradients + 2 * states * weights + small
    read = train.max_staleness + 1 if train.mode == "async" else train.staleness + 1  # versions tasks may read
    checkpoint = (1 + states + train.staleness) * weights
    building = 2 if train.staleness else 1
    run = (max(job.run.keep_versions, read) + building) * weights + (job.run.keep_checkpoints + 1) * checkpoint
    return Room(exchange=exchange, run=run)


def additive_room(job: Job, context: ModelContext, weights: int, *, per_epoch: int, slots: int) -> Room:
    """An additive model's peak: every partial and their sum (run directory), versions 0 and 1 (and the
    one ``keep_versions`` may hold), checkpoints of weights alone; the exchange holds the small files only."""
    statistics = context.stats_layout.size * np.dtype(np.float64).itemsize + FILE_OVERHEAD
    records = per_epoch * records_dtype(job.train.tasks_per_update).itemsize
    small = (2 * block_count(context.layout.size) * DIGEST_BYTES + records
             + Board(slots).size * WORD.itemsize + 3 * FILE_OVERHEAD)
    run = ((job.train.tasks_per_update + 1) * statistics + (max(job.run.keep_versions, 1) + 1) * weights
           + (job.run.keep_checkpoints + 1) * weights)
    return Room(exchange=small, run=run)


# Files a process has open besides the mapped exchange buffers: the dataset's shards, the run's logs and
# locks, the workers' pipes and sentinels, the interpreter's own (an estimate with room to spare).
OTHER_FILES = 512


def allow_open_files(job: Job) -> None:
    """Raise this process's soft limit of open files (which its workers inherit) to what the rounds map: every
    participant maps each task's gradient buffer (per bank) and the optimizer state, and each map holds a file
    descriptor. A hard limit below that refuses the job before anything is written (exit 2), naming the key."""
    banks = gradient_banks(job.train.staleness)
    needed = banks * job.train.tasks_per_update + 2 * len(state_names(job.train.optimizer)) + OTHER_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise InputError("train.tasks_per_update needs more open files than this process may have",
                         expected=f"a limit of at least {needed} open files (a mapped gradient buffer per task)",
                         found=f"a hard limit of {hard} (ulimit -Hn)",
                         hint="lower train.tasks_per_update, or raise the limit (ulimit -n) before memtrain starts")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
