"""A parameter count -> the benchmark MLP's shape, and a synthetic classification dataset written on disk.

The dataset is a standard memtrain dataset directory (manifest + shards), streamed shard by shard so a
dataset larger than RAM can be written with bounded memory. Shards hold a whole number of global batches,
so that no task of the benchmark straddles two shards (which would cost a copy).
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memtrain.dataset import FORMAT, write_manifest
from memtrain.files import checksum_file, publish_array
from memtrain.layout import MANIFEST, shard_name, tmp_sibling

# Features per row. Fixed, so that the parameter count changes only the hidden width: a task's data
# (512 rows x 4 KiB) stays small beside the weights, and the exchange, not the data, is what grows.
FEATURES = 1024
CLASSES = 10
BATCH = 512
SHARD_BYTES = 64 << 20
# The manifest's format version: 2, the oldest that holds these datasets (they have no table encoding, what
# version 3 adds), so that a checkout from before version 3 reads them too (``bench train --against``).
VERSION = 2


@dataclass(frozen=True)
class Shape:
    """MLP D -> H -> C with about ``params`` parameters."""

    features: int
    hidden: int
    classes: int

    @property
    def params(self) -> int:
        return self.features * self.hidden + self.hidden + self.hidden * self.classes + self.classes


def mlp_shape(params: int, features: int = FEATURES, classes: int = CLASSES) -> Shape:
    """The hidden width that gives closest to ``params`` parameters.

    >>> mlp_shape(1_000_000).params
    1000086
    """
    hidden = max(1, round((params - classes) / (features + 1 + classes)))
    return Shape(features, hidden, classes)


def shard_rows(features: int, batch: int = BATCH) -> int:
    """Rows per shard: a whole number of batches, about SHARD_BYTES of features."""
    return batch * max(1, SHARD_BYTES // (batch * features * 4))


def write_dataset(path: Path, train_rows: int, val_rows: int, *, features: int = FEATURES,
                  classes: int = CLASSES, seed: int = 0) -> Path:
    """Write (once) a synthetic dataset: y = argmax of a fixed random projection of x, plus noise.

    >>> write_dataset(Path("/tmp/ds"), 1024, 512)   # doctest: +SKIP
    """
    if (path / MANIFEST).exists():
        return path
    tmp = tmp_sibling(path)
    tmp.mkdir(parents=True)
    try:
        rng = np.random.default_rng(seed)
        projection = rng.standard_normal((features, classes), dtype=np.float32)
        splits = {name: _write_split(tmp, name, rows, projection, rng)
                  for name, rows in (("train", train_rows), ("val", val_rows))}
        stats = {"mean": [0.0] * features, "std": [1.0] * features, "min": [-6.0] * features,
                 "max": [6.0] * features}
        manifest = {"format": FORMAT, "version": VERSION, "task": "classification",
                    "rows": train_rows + val_rows, "x": {"shape": [features], "dtype": "float32"},
                    "y": {"shape": [], "dtype": "int64"}, "classes": [f"c{k}" for k in range(classes)],
                    "splits": splits, "stats": stats, "source": {"synthetic": True, "seed": seed},
                    "options": {}, "created": "synthetic"}
        write_manifest(tmp, manifest, durable=False)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _write_split(root: Path, name: str, rows: int, projection: np.ndarray,
                 rng: np.random.Generator) -> dict[str, object]:
    (root / name).mkdir()
    per_shard = shard_rows(projection.shape[0])
    shards = []
    for index in range(math.ceil(rows / per_shard)):
        count = min(per_shard, rows - index * per_shard)
        x = rng.standard_normal((count, projection.shape[0]), dtype=np.float32)
        y = np.argmax(x @ projection + rng.standard_normal((count, projection.shape[1]), dtype=np.float32), axis=1)
        entry = {"rows": count, "x": shard_name(name, "x", index), "y": shard_name(name, "y", index)}
        for part, array in (("x", x), ("y", y.astype(np.int64))):
            publish_array(root / entry[part], array, durable=False)
            entry[f"{part}_bytes"] = (root / entry[part]).stat().st_size
            entry[f"{part}_checksum"] = checksum_file(root / entry[part])
        shards.append(entry)
        del x, y
    return {"rows": rows, "shards": shards}
