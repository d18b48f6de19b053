"""Tiny datasets written straight in the documented dataset format (an independent check of the reader).

Used by the engine tests so that they do not depend on `prepare`; the format is the one in
memtrain/dataset.py and docs/formats.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xxhash

from memtrain.files import checksum_file, publish_array
from memtrain.layout import MANIFEST, shard_name


def blobs(n: int = 1200, features: int = 8, classes: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs, shifted and scaled so that normalization matters."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(classes, features)) * 2.5
    y = rng.integers(0, classes, n)
    x = (centers[y] + rng.normal(size=(n, features))) * 3.0 + 5.0
    return x.astype(np.float32), y.astype(np.int64)


def write_dataset(out: Path, x: np.ndarray, y: np.ndarray, *, task: str = "classification", val_rows: int | None = None,
                  shard_rows: int = 400) -> Path:
    """Write ``x``/``y`` as a dataset directory: the first ``val_rows`` rows are the validation split."""
    val_rows = len(x) // 10 if val_rows is None else val_rows
    splits = {"val": (x[:val_rows], y[:val_rows]), "train": (x[val_rows:], y[val_rows:])}
    manifest_splits = {name: _write_split(out, name, xs, ys, shard_rows) for name, (xs, ys) in splits.items()}
    train = x[val_rows:].reshape(len(x) - val_rows, -1).astype(np.float64)
    classes = [str(c) for c in range(int(y.max()) + 1)] if task == "classification" else None
    manifest = {
        "format": "memtrain.dataset", "version": 2, "task": task, "rows": len(x),
        "x": {"shape": list(x.shape[1:]), "dtype": str(x.dtype)},
        "y": {"shape": list(y.shape[1:]), "dtype": str(y.dtype)},
        "classes": classes, "splits": manifest_splits,
        "stats": {"mean": train.mean(0).tolist(), "std": train.std(0).tolist(),
                  "min": train.min(0).tolist(), "max": train.max(0).tolist()},
    }
    (out / MANIFEST).write_text(json.dumps(sealed(manifest)))
    return out


def sealed(record: dict) -> dict:
    """``record`` with its ``record_checksum``, computed as the README specifies (not with memtrain's code):
    XXH3-128 of the compact JSON of every other field, keys sorted, ASCII only."""
    body = {k: v for k, v in record.items() if k != "record_checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return {**body, "record_checksum": f"xxh3-128:{xxhash.xxh3_128_hexdigest(text.encode())}"}


def _write_split(out: Path, name: str, x: np.ndarray, y: np.ndarray, shard_rows: int) -> dict:
    (out / name).mkdir(parents=True, exist_ok=True)
    shards = []
    for index, start in enumerate(range(0, len(x), shard_rows)):
        record = {"rows": len(x[start:start + shard_rows])}
        for part, array in (("x", x), ("y", y)):
            rel = shard_name(name, part, index)
            publish_array(out / rel, array[start:start + shard_rows], durable=False)
            record[part] = rel
            record[f"{part}_bytes"] = (out / rel).stat().st_size
            record[f"{part}_checksum"] = checksum_file(out / rel)
        shards.append(record)
    return {"rows": len(x), "shards": shards}
