"""A run's position -> the numbers people and records see: the one definition of each counter.

Every writer (metrics.jsonl, lineage.jsonl, events.log, checkpoint names, messages, the progress bar)
numbers things the same way, so what the stop message says, what events.log says and what
``memtrain inspect`` shows always agree:

- **epoch**: counted from 1. "epoch 3" is the third pass over the training split; "3 epochs done" means
  epoch 3 was the last one finished (a checkpoint's ``"epoch"`` is that count).
- **batch**: counted from 1 within its epoch.
- **update**: counted from 1 over the whole run. Update n's records say ``"update": n``, which is also the
  number of updates done once it is: the name of a checkpoint taken then (``c0000000n``) and the
  ``"update"`` of the epoch record of the epoch that it ends.
- **version**: weight versions count published steps: 0 is the initialization.
- An additive model (ridge, naive Bayes) has no epochs to count: it is fitted in ``ONE_PASS`` (version 1),
  and what people see says so instead of an epoch count.

Inside the server a position is (epochs finished, batches finished in the current epoch); the plan
numbers epochs, batches and updates from 0. These functions are the only place where the two meet.
"""

from __future__ import annotations

ONE_PASS = "one pass of statistics, then a solve"


def epoch_number(epoch_index: int) -> int:
    """The number people see for the epoch with 0-based index ``epoch_index``."""
    return epoch_index + 1


def batch_number(batch_index: int) -> int:
    return batch_index + 1


def update_number(update_index: int) -> int:
    return update_index + 1


def position_text(epochs_done: int, batches_done: int, per_epoch: int) -> str:
    """Where a run stands, in words: ``after batch 4 of 11 of epoch 168`` or ``at the end of epoch 167``.

    >>> position_text(167, 0, 11), position_text(167, 4, 11), position_text(0, 0, 11)
    ('at the end of epoch 167', 'after batch 4 of 11 of epoch 168', 'before epoch 1')
    """
    if batches_done == 0:
        return f"at the end of epoch {epochs_done}" if epochs_done else "before epoch 1"
    return f"after batch {batches_done} of {per_epoch} of epoch {epoch_number(epochs_done)}"
