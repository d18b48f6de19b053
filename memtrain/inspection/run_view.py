"""A run directory -> a plain dict: the job, progress, and one row per checkpoint and weight version on disk.

Safe on a live run: it lists published names only (temporary names never match), reads the logs
(``read_jsonl`` skips a torn last line), takes no lock, and tolerates a weight version or checkpoint that
the run retires while it is being read. "complete" is a cheap check (meta.json readable, every file
present with its recorded size); checksums are only re-hashed with ``--verify``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from memtrain.errors import MemtrainError
from memtrain.files import read_jsonl, read_sealed_jsonl
from memtrain.inspection.lineage_view import schedule_summary
from memtrain.inspection.tensor_view import SCHEMA, metrics_by_version
from memtrain.inspection.tensors import complete_problem
from memtrain.layout import (
    RUN_JOB,
    RUN_LINEAGE,
    RUN_METRICS,
    checkpoint_path,
    checkpoint_updates,
    weight_versions,
    weights_path,
)
from memtrain.train.records.checkpoint import read_meta
from memtrain.train.records.record import read_history, recorded_job
from memtrain.train.records.run_dir import read_params


def run_view(run: Path) -> dict[str, Any]:
    job, history, problems = records(run)
    params = None
    try:
        params = read_params(run)
    except MemtrainError as exc:
        problems.append(str(exc))
    metrics = read_jsonl(run / RUN_METRICS)
    lineage_records, damaged = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage record")
    problems += [str(exc) for exc in damaged]
    lineage = {r["version"]: r for r in lineage_records if isinstance(r.get("version"), int)}
    context = (metrics_by_version(metrics), lineage)
    rows = [row for update in checkpoint_updates(run) if (row := checkpoint_row(run, update, *context))]
    rows += [row for version in weight_versions(run) if (row := weights_row(run, version, *context))]
    rows.sort(key=lambda row: (row["version"] if row["version"] is not None else -1, row["type"] == "weights"))
    newest = mark_newest_complete(rows)
    return {"schema": SCHEMA, "kind": "run", "path": str(run), "job": job, "history": history,
            "record_problems": problems,
            "params": {"count": params.get("size"), "tensors": len(params.get("params", []))} if params else None,
            "progress": progress(job, metrics, lineage), "schedule": schedule_summary(run, job), "entries": rows,
            "newest_complete": newest}


def records(run: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[str]]:
    """The job the run follows now (job.json with its history's changes), its history, and why either is
    untrusted (a damaged record is reported, not shown as if it were true)."""
    if not (run / RUN_JOB).exists():
        return None, [], []
    try:
        return recorded_job(run), read_history(run), []
    except MemtrainError as exc:
        return None, [], [str(exc)]


def progress(job: dict[str, Any] | None, metrics: list[dict[str, Any]],
             lineage: dict[int, dict[str, Any]]) -> dict[str, Any]:
    epochs = [r for r in metrics if r.get("kind") == "epoch"]
    scored = [r for r in epochs if isinstance(r.get("val_loss"), float)]
    return {"epochs_done": max((r.get("epoch", 0) for r in epochs), default=0),
            "epochs": (job or {}).get("train", {}).get("epochs"),
            "updates": sum(r.get("kind") == "update" for r in metrics),
            "newest_version": max(lineage, default=None),
            "last_epoch": epochs[-1] if epochs else None,
            "best_epoch": min(scored, key=lambda r: r["val_loss"]) if scored else None,
            # an additive model's version 1 is its solve: a run of no epochs (train/records/counters.py, ONE_PASS)
            "one_pass": "solve" in lineage.get(1, {})}


def _row(kind: str, path: Path, version: int | None, metrics: dict[int, dict[str, Any]],
         lineage: dict[int, dict[str, Any]]) -> dict[str, Any]:
    logged = metrics.get(version, {}) if version is not None else {}
    origin = lineage.get(version, {}) if version is not None else {}
    return {"type": kind, "name": path.name, "path": str(path), "version": version,
            "update": origin.get("update") if isinstance(origin.get("update"), int) else 0 if version == 0 else None,
            "epoch": origin.get("epoch") if isinstance(origin.get("epoch"), int) else None,
            "train_loss": logged.get("loss"), "metrics_from": logged.get("kind"),
            "val_loss": logged.get("val_loss"), "val_accuracy": logged.get("val_accuracy"),
            "written": None, "bytes": None, "complete": True, "newest_complete": False, "verified": None,
            "problem": None}


def checkpoint_row(run: Path, update: int, metrics: dict[int, dict[str, Any]],
                   lineage: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """A checkpoint's row, or None if a live run pruned it while we looked."""
    path = checkpoint_path(run, update)
    problem = complete_problem(path)
    if problem is not None and not path.exists():
        return None
    meta = _meta_or_none(path)
    version = meta.get("weights_version") if meta else None
    row = _row("checkpoint", path, version, metrics, lineage)
    row |= {"update": meta.get("update", row["update"]) if meta else update,
            "written": meta.get("created") if meta else None, "bytes": _dir_bytes(path),
            "complete": problem is None, "problem": problem}
    if row["epoch"] is None and meta:
        row["epoch"] = meta.get("epoch")
    return row


def weights_row(run: Path, version: int, metrics: dict[int, dict[str, Any]],
                lineage: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    """A weight version's row, or None if a live run retired it while we looked."""
    path = weights_path(run, version)
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return _row("weights", path, version, metrics, lineage) | {"written": _timestamp(info.st_mtime),
                                                               "bytes": info.st_size}


def mark_newest_complete(rows: list[dict[str, Any]]) -> str | None:
    """Flag the newest complete checkpoint (what ``memtrain train --resume`` would start from)."""
    complete = [row for row in rows if row["type"] == "checkpoint" and row["complete"]]
    if not complete:
        return None
    complete[-1]["newest_complete"] = True
    return complete[-1]["name"]


def _meta_or_none(path: Path) -> dict[str, Any] | None:
    try:
        return read_meta(path)
    except (MemtrainError, OSError):  # already reported as the row's problem
        return None


def _dir_bytes(path: Path) -> int:
    total = 0
    for entry in os.scandir(path) if path.is_dir() else ():
        try:
            total += entry.stat().st_size
        except FileNotFoundError:
            continue
    return total


def _timestamp(seconds: float) -> str:
    """The same form as a checkpoint's ``created``: local time with its UTC offset."""
    return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(seconds))
