"""A dataset -> refused before training when it cannot be trained on: no training rows, or a non-finite value
in the validation split (which would print ``val_loss nan`` every epoch and exit 0).

`memtrain prepare` refuses non-finite values (or drops them with ``--drop-nonfinite``), but a dataset can be
written by hand or by an older tool. The training split is not scanned here (it can be far larger than RAM,
and a non-finite training row stops the run at its first update, naming the task's rows); the validation
split is read whole by every evaluation anyway, so scanning it once at start costs one more pass.
"""

from __future__ import annotations

import numpy as np

from memtrain.dataset import Dataset, Split
from memtrain.errors import InputError

# Bytes of rows scanned at once: large enough to run at memory bandwidth, small enough to bound memory.
SCAN_BYTES = 64 << 20


def check_trainable(dataset: Dataset) -> None:
    """InputError (exit 2) naming the split, and the row and column of the first non-finite value."""
    if dataset.split("train").rows == 0:
        raise InputError("the dataset has no training rows: there is nothing to train on", path=dataset.path,
                         where="train split", expected="at least 1 row", found="0 rows",
                         hint="prepare it again with a smaller --val-fraction, or from a larger source")
    _check_finite(dataset, dataset.split("val"))


def _check_finite(dataset: Dataset, split: Split) -> None:
    row_bytes = max(1, int(np.prod(split.x_shape)) * split.x_dtype.itemsize)
    step = max(1, SCAN_BYTES // row_bytes)
    for lo in range(0, split.rows, step):
        x, y = split.read(lo, min(lo + step, split.rows))
        for part, values in (("x", x), ("y", y)):
            if values.dtype.kind != "f":
                continue
            flat = np.asarray(values).reshape(len(values), -1)
            bad = ~np.isfinite(flat)
            if bad.any():
                row, column = (int(i) for i in np.argwhere(bad)[0])
                _raise(dataset, split, part, lo + row, column, flat[row, column])


def _raise(dataset: Dataset, split: Split, part: str, row: int, column: int, value: float) -> None:
    shard, first, _ = split.segments(row, row + 1)[0]
    path = split.shards[shard].x_path if part == "x" else split.shards[shard].y_path
    what = f"feature {column}" if part == "x" else f"target {column}" if split.y_shape else "the target"
    raise InputError(f"non-finite value in the {split.name} split: row {row}, {what}", path=path,
                     where=f"row {first}", expected="a finite number", found=repr(float(value)),
                     hint="every evaluation would be NaN; fix the source and prepare the dataset again "
                          "(memtrain prepare refuses such rows, or drops them with --drop-nonfinite)")
