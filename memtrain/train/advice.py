"""A job + the size of its train split -> advice printed when training starts (nothing when all is well).

One update per epoch (full batch) is the default reduction, as in the design: it is what makes a round
cheap to coordinate. But a gradient model given only a handful of updates in all has barely moved from
its initialization (a minimal job on the digits, 10 epochs, reached 0.27 validation accuracy), so below
``FEW_UPDATES`` in total the start of training says so and suggests a batch size.
"""

from __future__ import annotations

from memtrain.config import Job
from memtrain.errors import plural
from memtrain.train.plan import updates_per_epoch

# Fewer updates than this in a whole run rarely train a gradient model well: SGD and Adam take steps of
# lr-sized magnitude, and at common learning rates it takes on the order of a hundred to get anywhere.
FEW_UPDATES = 100
SMALLEST_SUGGESTED_BATCH = 16


def few_updates_note(job: Job, train_rows: int, additive: bool) -> str | None:
    """The advice for a gradient model that will get fewer than ``FEW_UPDATES`` updates, else None."""
    per_epoch = updates_per_epoch(train_rows, job.train.batch_size)
    total = per_epoch * job.train.epochs
    if additive or total >= FEW_UPDATES or train_rows <= SMALLEST_SUGGESTED_BATCH:
        return None
    how = ("one full-batch update per epoch, as train.batch_size is not set" if job.train.batch_size is None
           else f"{plural(per_epoch, 'update')} per epoch at train.batch_size = {job.train.batch_size}")
    batch = suggested_batch_size(train_rows, job.train.epochs)
    return (f"this job makes only {plural(total, 'update')} in all ({how}, {plural(job.train.epochs, 'epoch')}); "
            f"a gradient model usually needs hundreds. Set train.batch_size (e.g. --set train.batch_size={batch}: "
            f"{plural(updates_per_epoch(train_rows, batch) * job.train.epochs, 'update')}) or raise train.epochs")


def suggested_batch_size(train_rows: int, epochs: int) -> int:
    """The largest power of two that gives at least ``FEW_UPDATES`` updates in ``epochs`` epochs (at least 16)."""
    batch = SMALLEST_SUGGESTED_BATCH
    while updates_per_epoch(train_rows, batch * 2) * epochs >= FEW_UPDATES:
        batch *= 2
    return batch
