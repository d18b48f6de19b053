"""A dataset directory -> a plain dict: rows, splits, shards, class counts (streamed) and feature statistics.

Class counts are a ``bincount`` streamed over the label shards; feature statistics are the ones
``prepare`` recorded in the manifest (train split), shown for the first ``FEATURES_SHOWN`` features
unless every one is asked for.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.dataset import Dataset, Split, open_dataset
from memtrain.inspection.stats import CHUNK, Summary, chunks
from memtrain.inspection.tensor_view import SCHEMA

FEATURES_SHOWN = 10
STAT_KEYS = ("mean", "std", "min", "max")


def dataset_view(path: Path, *, every_feature: bool = False, chunk: int = CHUNK) -> dict[str, Any]:
    dataset = open_dataset(path)
    manifest = dataset.manifest
    classes = dataset.classes
    return {"schema": SCHEMA, "kind": "dataset", "path": str(path), "format_version": manifest.get("version"),
            "task": dataset.task, "rows": manifest.get("rows"), "x": manifest.get("x"), "y": manifest.get("y"),
            "splits": {name: split_view(path, manifest, split) for name, split in dataset.splits.items()},
            "classes": class_counts(dataset, classes, chunk) if classes else None,
            "targets": None if classes else target_stats(dataset, chunk),
            "features": feature_stats(dataset, every_feature),
            "source": manifest.get("source"), "created": manifest.get("created")}


def split_view(root: Path, manifest: dict[str, Any], split: Split) -> dict[str, Any]:
    records = manifest["splits"][split.name]["shards"]
    shards = []
    for index, (shard, record) in enumerate(zip(split.shards, records, strict=True)):
        shards.append({"index": index, "rows": shard.rows,
                       "x": str(shard.x_path.relative_to(root)), "y": str(shard.y_path.relative_to(root)),
                       "x_bytes": record.get("x_bytes", os.path.getsize(shard.x_path)),
                       "y_bytes": record.get("y_bytes", os.path.getsize(shard.y_path)),
                       "x_checksum": shard.x_checksum, "y_checksum": shard.y_checksum, "verified": None})
    return {"rows": split.rows, "shards": shards}


def class_counts(dataset: Dataset, classes: list[str], chunk: int) -> list[dict[str, Any]]:
    """Rows per class and split; labels outside ``[0, len(classes))`` are counted under index None."""
    splits = list(dataset.splits)
    counts = {name: label_counts(dataset.split(name), len(classes), chunk) for name in splits}
    rows = [{"index": i, "name": name} | {s: int(counts[s][i]) for s in splits} for i, name in enumerate(classes)]
    other = {s: int(counts[s][-1]) for s in splits}
    if any(other.values()):
        rows.append({"index": None, "name": "(out of range)"} | other)
    for row in rows:
        row["total"] = sum(row[s] for s in splits)
    return rows


def label_counts(split: Split, n_classes: int, chunk: int) -> np.ndarray:
    """Counts of labels 0..n-1, and in the last slot the labels outside that range."""
    counts = np.zeros(n_classes + 1, dtype=np.int64)
    for index in range(len(split.shards)):
        _, y = split.shard_arrays(index)
        for piece in chunks(y, chunk):
            labels = piece.astype(np.int64)
            inside = (labels >= 0) & (labels < n_classes)
            counts[:n_classes] += np.bincount(labels[inside], minlength=n_classes)
            counts[n_classes] += int(labels.size - inside.sum())
    return counts


def target_stats(dataset: Dataset, chunk: int) -> dict[str, Any]:
    """Regression targets: streamed statistics of y per split."""
    result = {}
    for name, split in dataset.splits.items():
        summary = Summary()
        for index in range(len(split.shards)):
            for piece in chunks(split.shard_arrays(index)[1], chunk):
                summary.add(piece)
        result[name] = summary.to_dict()
    return result


def feature_stats(dataset: Dataset, every_feature: bool) -> dict[str, Any]:
    """Per-feature mean/std/min/max as recorded in the manifest (None where it recorded nothing)."""
    stats = dataset.manifest.get("stats") or {}
    count = dataset.n_features
    shown = count if every_feature else min(count, FEATURES_SHOWN)
    names = dataset.manifest.get("feature_names") or {}
    rows = [{"index": i, "name": _at({"names": names}, "names", i)} | {key: _at(stats, key, i) for key in STAT_KEYS}
            for i in range(shown)]
    return {"count": count, "shown": shown, "source": "manifest (train split)", "stats": rows}


def _at(stats: dict[str, Any], key: str, index: int) -> Any:
    values = stats.get(key)
    return values[index] if isinstance(values, list) and index < len(values) else None
