"""A job + the size of its train split -> advice printed when training starts (nothing when all is well).

One update per epoch (full batch) is the default reduction, as in the design: it is what makes a round
cheap to coordinate. But a gradient model given only a handful of updates in all has barely moved from
its initialization (a minimal job on the digits, 10 epochs, reached 0.27 validation accuracy), so below
``FEW_UPDATES`` in total the start of training says so and suggests a batch size.

An additive model is solved in one pass (train/loops/additive.py): the keys of epochs, batches and the optimizer
do not apply to it, and a job that sets them is told so (they are ignored, not refused: one job file
can try a gradient model and an additive one by changing ``model.kind`` alone).
"""

from __future__ import annotations

import dataclasses

from memtrain.config import Job, OptimizerConfig, TrainConfig
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


# [train] keys that mean nothing to a model solved in one pass of statistics
ONE_PASS_IGNORES = ("epochs", "batch_size", "patience")


def one_pass_note(job: Job) -> str | None:
    """For an additive model: the keys the job sets (away from their defaults) that do not apply, else None."""
    train, defaults = job.train, TrainConfig()
    keys = [f"train.{key} = {getattr(train, key)!r}" for key in ONE_PASS_IGNORES
            if getattr(train, key) != getattr(defaults, key)]
    keys += [f"train.{'optimizer' if f.name == 'name' else f.name} = {getattr(train.optimizer, f.name)!r}"
             for f in dataclasses.fields(OptimizerConfig)
             if getattr(train.optimizer, f.name) != getattr(defaults.optimizer, f.name)]
    if not keys:
        return None
    return (f"model '{job.model.kind}' is additive, solved in one pass of statistics (no epochs, batches or "
            "optimizer): "
            f"{', '.join(keys)} {'does' if len(keys) == 1 else 'do'} not apply and {'is' if len(keys) == 1 else 'are'}"
            " ignored")


def suggested_batch_size(train_rows: int, epochs: int) -> int:
    """The largest power of two that gives at least ``FEW_UPDATES`` updates in ``epochs`` epochs (at least 16)."""
    batch = SMALLEST_SUGGESTED_BATCH
    while updates_per_epoch(train_rows, batch * 2) * epochs >= FEW_UPDATES:
        batch *= 2
    return batch
