"""A benchmark problem -> a memtrain job run through the real ``train`` path -> per-update wall and compute times.

The times come from the run's own ``metrics.jsonl``: one record per update, stamped when the update's
version is published and logged, so they include everything the loop does (publication, dispatch,
gradient files, reduction, optimizer step, retirement, logs). Worker compute time is the slowest
gradient task of the update, as the worker measured it (``compute_s``); absent, it is left out.
Update 0 has no wall time of its own (it starts with the workers), so the lists begin at update 1.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from memtrain.benchmarks.problem import Problem, timings
from memtrain.config import DataConfig, Job, ModelConfig, RunConfig, TrainConfig
from memtrain.files import read_jsonl
from memtrain.layout import RUN_METRICS


def job_for(problem: Problem, run_dir: Path, exchange: str = "auto", model: ModelConfig | None = None) -> Job:
    """The memtrain job that computes exactly what the peers compute (memtrain's MLP unless ``model``)."""
    return Job(
        data=DataConfig(path=Path(problem.dataset), normalize=False),
        model=model or ModelConfig("mlp", {"hidden": [problem.hidden]}),
        train=TrainConfig(epochs=1, batch_size=problem.batch, tasks_per_update=problem.workers,
                          workers=problem.workers, seed=problem.seed, optimizer=problem.optimizer),
        run=RunConfig(dir=run_dir, exchange=exchange, keep_versions=2),
    )


def run_memtrain(problem: Problem, run_dir: Path, exchange: str = "auto",
                 model: ModelConfig | None = None) -> dict[str, object]:
    from memtrain.train.server import train

    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.perf_counter()
    try:
        summary = train(job_for(problem, run_dir, exchange, model))
        total = time.perf_counter() - started
        records = [r for r in read_jsonl(run_dir / RUN_METRICS) if r.get("kind") == "update"]
        events = (run_dir / "events.log").read_text(encoding="utf-8").splitlines()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    stamps = [r["time"] for r in records]
    walls = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    computes = [r["compute_s"] for r in records[1:] if "compute_s" in r]
    return timings(walls, computes, first_update=1, total_seconds=total, version=summary.version,
                   exchange=[line.split(" ", 1)[1] for line in events if "exchange" in line])
