"""A run's lineage -> its staleness histogram, and for any version the versions its gradients came from.

Every gradient's staleness is how many versions older than the one it was applied to were the weights it
was computed at: 0 everywhere in synchronous training, k (after the first k updates) with fixed
staleness k, spread between 0 and ``max_staleness`` in async mode (docs/async.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memtrain.errors import CorruptFileError, InputError
from memtrain.inspection.tensor_view import SCHEMA
from memtrain.layout import weight_versions
from memtrain.train.records.lineage import Lineage, Step, read_lineage
from memtrain.train.records.record import recorded_job


def schedule_summary(run: Path, job: dict[str, Any] | None) -> dict[str, Any] | None:
    """Mode, staleness histogram, mean and max of a run's applied gradients; None for a run with no updates."""
    try:
        lineage = read_lineage(run)
    except CorruptFileError as exc:
        return {"problem": str(exc)}
    if not lineage.steps:
        return None
    train = (job or {}).get("train", {})
    histogram = lineage.staleness_histogram()
    count = sum(histogram.values())
    return {"mode": train.get("mode", "sync"), "staleness": train.get("staleness", 0),
            "max_staleness": train.get("max_staleness"), "async_group": train.get("async_group"),
            "gradients": count, "histogram": [{"staleness": s, "gradients": n, "share": n / count}
                                              for s, n in histogram.items()],
            "mean": sum(s * n for s, n in histogram.items()) / count, "max": max(histogram),
            "discarded": sum(step.discarded for step in lineage.steps), "problem": None}


def lineage_view(run: Path, version: int) -> dict[str, Any]:
    """Version ``version`` of ``run``: its parent, its gradients in the order they were added (rows, the
    version each was computed at, staleness), and the later versions that used it. ``shuffled``: each
    gradient's ``rows`` are positions of its epoch's shuffled row order (``train.shuffle = "rows"``)."""
    lineage = read_lineage(run)
    if not 0 <= version <= lineage.final_version:
        raise InputError("no such version in the run's lineage", path=lineage.path,
                         expected=f"0 to {lineage.final_version}", found=version)
    step = lineage.step(version)
    used_by = sorted({s.version for s in lineage.steps if any(g.at == version for g in s.gradients)})
    return {"schema": SCHEMA, "kind": "lineage", "path": str(run), "version": version,
            "on_disk": version in weight_versions(run), "shuffled": _shuffled(run),
            **_step_fields(version, step, lineage), "used_by": used_by}


def _shuffled(run: Path) -> bool:
    """Whether the run's gradient tasks name positions of each epoch's shuffled row order (train.shuffle =
    "rows" with batches), not rows: docs/formats.md. False when the job record cannot be read."""
    try:
        train = recorded_job(run)["train"]
    except (CorruptFileError, InputError):
        return False
    return train.get("shuffle") == "rows" and train.get("batch_size") is not None


def _step_fields(version: int, step: Step | None, lineage: Lineage) -> dict[str, Any]:
    if step is None:
        origin = "initialization" if version == 0 else "closed-form solve"
        return {"origin": origin, "parent": None, "update": None, "epoch": None, "lr": None,
                "checksum": lineage.init_checksum, "gradients": [], "sources": []}
    gradients = [{"order": i, "rows": [g.lo, g.hi], "at": g.at, "staleness": step.parent - g.at}
                 for i, g in enumerate(step.gradients)]
    return {"origin": "update", "parent": step.parent, "update": step.update, "epoch": step.epoch,
            "lr": step.lr, "checksum": step.checksum, "gradients": gradients,
            "sources": sorted({g.at for g in step.gradients})}

