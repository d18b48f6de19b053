"""An epoch order (memtrain/order.py) -> how well it mixes: batch compositions kept across epochs, classes per batch,
the classes' shares along the epoch.

Three measures, all exact counts (no sampling), so they are the same on every machine:

- ``kept_pairs``: of the pairs of rows that share a batch in epoch e, the share that share one again in
  epoch e + 1. Fixed batches keep all of them (1.0); a uniform shuffle keeps about
  (batch - 1) / (rows - 1), 0.24% for batches of 512 from 216,000 rows.
- ``classes_per_batch``: on a source sorted by class (row i has class ``i * classes // rows``), the mean
  number of distinct classes in a batch: 1 to 2 when batches are contiguous rows.
- ``share_drift``: on the same source, the largest gap between a class's share of a stretch of ``STRETCH``
  consecutive rows of the epoch order and its share of the split (0.1 of 10 classes). What a model
  trained along the epoch sees: a stretch that leans to a few classes tilts it towards them (a uniform
  shuffle: about 0.005 for 65,536 rows of 10 classes).

>>> m = mixing("batches", rows=216_000, batch_size=512, classes=10)
>>> m.kept_pairs, round(m.classes_per_batch, 2)
(1.0, 1.02)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memtrain.order import WINDOW, check_integer, epoch_order

STRETCH = 1 << 16  # rows per stretch of share_drift: 128 batches of 512


@dataclass(frozen=True, kw_only=True)
class Mixing:
    shuffle: str
    window: int
    rows: int
    batch_size: int
    kept_pairs: float  # share of the row pairs sharing a batch in epoch e that share one in epoch e + 1
    uniform_pairs: float  # the same share expected from a uniform shuffle: (batch - 1) / (rows - 1)
    classes_per_batch: float  # mean distinct classes per batch of epoch e on a class-sorted source
    classes: int
    share_drift: float  # largest |a class's share of STRETCH consecutive rows - its share of the split|


def batch_of_row(shuffle: str, *, rows: int, batch_size: int, seed: int, epoch: int, window: int) -> np.ndarray:
    """For every row, the number of the batch it is in during ``epoch`` (O(rows): for measuring only)."""
    order = epoch_order(shuffle, rows=rows, batch_size=batch_size, seed=seed, epoch=epoch, window=window)
    where = np.empty(rows, dtype=np.int64)
    for k in range(order.batches):
        where[np.asarray(order.batch(k))] = k
    return where


def mixing(shuffle: str, *, rows: int, batch_size: int, classes: int, seed: int = 0, epoch: int = 0,
           window: int = WINDOW) -> Mixing:
    """Measure epoch ``epoch`` against epoch ``epoch + 1`` of a split of ``rows`` rows sorted by class."""
    check_integer("classes", classes, 1)  # the rest are checked by the order
    now = batch_of_row(shuffle, rows=rows, batch_size=batch_size, seed=seed, epoch=epoch, window=window)
    then = batch_of_row(shuffle, rows=rows, batch_size=batch_size, seed=seed, epoch=epoch + 1, window=window)
    both = np.unique(now * (then.max() + 1) + then, return_counts=True)[1]  # rows per (batch now, batch then)
    per_batch = np.bincount(now)
    pairs = float(np.sum(per_batch * (per_batch - 1) // 2))
    kept = float(np.sum(both * (both - 1) // 2))
    label = np.arange(rows, dtype=np.int64) * classes // rows
    distinct = np.unique(now * classes + label).size  # distinct (batch, class) pairs
    sequence = label[np.argsort(now, kind="stable")]  # the labels in epoch order (rows within a batch: any order)
    drift = 0.0
    for lo in range(0, rows - STRETCH + 1, STRETCH):  # whole stretches only
        share = np.bincount(sequence[lo:lo + STRETCH], minlength=classes) / STRETCH
        drift = max(drift, float(np.abs(share - np.bincount(label, minlength=classes) / rows).max()))
    return Mixing(shuffle=shuffle, window=window, rows=rows, batch_size=batch_size,
                  kept_pairs=kept / pairs if pairs else 0.0,
                  uniform_pairs=(batch_size - 1) / (rows - 1) if rows > 1 else 0.0,
                  classes_per_batch=distinct / len(per_batch), classes=classes, share_drift=drift)


def mixing_table(*, rows: int = 216_000, batch_size: int = 512, classes: int = 10, window: int = WINDOW) -> str:
    """The docs' table: ``"batches"`` against ``"rows"`` at a quarter of ``window``, at ``window``, and over the
    whole split (a uniform shuffle) (``python -m memtrain.mixing``)."""
    lines = [f"{rows:,} rows sorted by class ({classes} classes), batches of {batch_size}, epoch 0 -> 1",
             f"{'shuffle':<24} {'kept pairs':>11} {'uniform':>9} {'classes/batch':>14} {'share drift':>12}"]
    for shuffle, size in (("batches", window), ("rows", window // 4), ("rows", window), ("rows", rows)):
        m = mixing(shuffle, rows=rows, batch_size=batch_size, classes=classes, window=size)
        name = shuffle if shuffle != "rows" else f"rows, window {size:,}"
        lines.append(f"{name:<24} {m.kept_pairs:>10.2%} {m.uniform_pairs:>8.2%} {m.classes_per_batch:>14.2f} "
                     f"{m.share_drift:>12.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(mixing_table())
