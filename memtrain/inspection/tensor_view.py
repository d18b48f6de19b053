"""A checkpoint, weight version, gradient or .npy file -> a plain dict: one stats row per named parameter.

Statistics are streamed over the memmap (``stats.summarise``), so a checkpoint larger than memory is
summarised in bounded memory. The dict is what ``--json`` prints and what the tables are drawn from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.files import read_jsonl, read_sealed_jsonl
from memtrain.inspection.detect import Target
from memtrain.inspection.stats import CHUNK, EMPTY_STATS, Summary, is_numeric, summarise
from memtrain.inspection.tensors import Tensors, checkpoint_file, open_tensors
from memtrain.inspection.verify import lineage_checksums
from memtrain.layout import RUN_LINEAGE, RUN_METRICS, optimizer_state_name
from memtrain.train.records.checkpoint import read_meta

SCHEMA = 1  # version of the --json output; bumped when a key changes meaning or disappears


def param_rows(arrays: dict[str, np.ndarray], chunk: int = CHUNK) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One row per array (name, shape, dtype, size, min, max, mean, std, l2, nan, inf) and the total row."""
    rows, total, numeric = [], Summary(), False
    for name, array in arrays.items():
        row = {"name": name, "shape": list(array.shape), "dtype": array.dtype.name, "size": int(array.size)}
        if is_numeric(array.dtype):
            summary = summarise(array, chunk)
            total.merge(summary)
            numeric = True
            row |= summary.to_dict()
        else:
            row |= EMPTY_STATS
        rows.append(row)
    size = sum(row["size"] for row in rows)
    return rows, {"name": "(all)", "size": size} | (total.to_dict() if numeric else EMPTY_STATS)


def base_view(kind: str, target: Target, tensors: Tensors, chunk: int) -> dict[str, Any]:
    rows, total = param_rows(tensors.arrays, chunk)
    tensors.check_unchanged()
    return {"schema": SCHEMA, "kind": kind, "path": str(target.path),
            "run": str(target.run) if target.run else None,
            "file": str(tensors.path), "bytes": os.path.getsize(tensors.path),
            "named_by": str(tensors.named_by) if tensors.named_by else None,
            "params": rows, "total": total, "verified": None}


def tensor_view(target: Target, chunk: int = CHUNK) -> dict[str, Any]:
    """The view of a checkpoint, weight version, gradient or .npy file."""
    view = base_view(target.kind, target, open_tensors(target), chunk)
    if target.kind == "checkpoint":
        view |= checkpoint_details(target.path, chunk)
        view["metrics"] = version_metrics(target.run, view["weights_version"])
    elif target.kind == "weights":
        view |= {"version": target.version, "lineage": lineage_record(target.run, target.version),
                 "checksum": lineage_checksums(target.run).get(target.version) if target.run else None,
                 "metrics": version_metrics(target.run, target.version)}
    elif target.kind == "gradient":
        view |= {"version": target.version, "task": target.task, "attempt": target.attempt}
    else:
        view["checkpoint"] = str(target.checkpoint) if target.checkpoint else None
    return view


def checkpoint_details(path: Path, chunk: int) -> dict[str, Any]:
    meta = read_meta(path)
    optimizer = dict(meta.get("optimizer", {}))
    slots = []
    for slot in optimizer.get("slots", []):
        state = checkpoint_file(path, optimizer_state_name(slot))
        _, total = param_rows(state.arrays, chunk)
        slots.append({"slot": slot, "file": state.path.name} | {k: v for k, v in total.items() if k != "name"})
    optimizer["state"] = slots
    files = [{"name": name, "bytes": record.get("bytes"), "checksum": record.get("checksum"), "verified": None}
             for name, record in meta.get("files", {}).items()]
    return {"update": meta.get("update"), "epoch": meta.get("epoch"), "weights_version": meta.get("weights_version"),
            "created": meta.get("created"), "model": meta.get("model"), "optimizer": optimizer,
            "best": meta.get("best") or None, "files": files}


def lineage_record(run: Path | None, version: int | None) -> dict[str, Any] | None:
    if run is None:
        return None
    records, _ = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage record")  # a damaged line is not shown
    found = [r for r in records if r.get("version") == version]
    return found[-1] if found else None


def version_metrics(run: Path | None, version: int | None) -> dict[str, Any] | None:
    """The metrics logged when ``version`` was current: its epoch record if it ended an epoch, else its update's."""
    if run is None or version is None:
        return None
    return metrics_by_version(read_jsonl(run / RUN_METRICS)).get(version)


def metrics_by_version(records: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Version -> the last epoch record with that version, or else the last update record with it."""
    found: dict[int, dict[str, Any]] = {}
    for kind in ("update", "epoch"):
        for record in records:
            if record.get("kind") == kind and isinstance(record.get("version"), int):
                found[record["version"]] = record
    return found
