"""A benchmark problem -> a memtrain job run through the real ``train`` path -> per-update wall and compute times.

The times come from the run's own ``metrics.jsonl``: one record per update, stamped when the update's
version is published, so they include everything the rounds do (gradients, step, publication,
checksums, logs). Worker compute time is the slowest participant's gradient time of the update, as it
measured it (``compute_s``).

The job runs ``problem.epochs`` epochs to its end, as a user's job does: with ``train.workers = "auto"``
it first decides where its rounds run (train/placement.py), and that trial is part of the run. The
harness (train_bench.py) compares a run of E epochs with one of 2E, so that what a run pays once (start-up,
the placement's trial, the last checkpoint) cancels; the per-update records here give the compute time
and where the rounds ran. (Until issue 32 an "auto" run was stopped by SIGINT once enough updates had
followed its decision, and timed from the decision on: the trial's updates were never counted.)
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path

from memtrain.benchmarks.problem import Problem, timings
from memtrain.config import DataConfig, Job, ModelConfig, RunConfig, TrainConfig
from memtrain.files import read_jsonl
from memtrain.layout import RUN_EVENTS, RUN_METRICS

NEVER = 10_000  # checkpoint_every in epochs: no checkpoint but the last (the peers write none)
DECIDED = re.compile(r"rounds: (?:(?:on|in) .*? from update (\d+)|on \d+ worker processes \(|in the server \()")


def job_for(problem: Problem, run_dir: Path, exchange: str = "auto", workers: int | str = 2,
            model: ModelConfig | None = None, cluster: str = "") -> Job:
    """The memtrain job that computes exactly what the peers compute (memtrain's MLP unless ``model``)."""
    return Job(
        data=DataConfig(path=Path(problem.dataset), normalize=False),
        model=model or ModelConfig("mlp", {"hidden": [problem.hidden]}),
        train=TrainConfig(epochs=problem.epochs, batch_size=problem.batch,
                          tasks_per_update=problem.workers, workers=workers, seed=problem.seed,
                          shuffle=problem.shuffle, optimizer=problem.optimizer),
        run=RunConfig(dir=run_dir, exchange=exchange, keep_versions=2, checkpoint_every=NEVER,
                      cluster=cluster),
    )


def decided_at(run_dir: Path) -> int | None:
    """The update from which the placement's choice holds (0 when train.workers forced it), or None yet."""
    path = run_dir / RUN_EVENTS
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    for match in DECIDED.finditer(text):
        return int(match.group(1)) if match.group(1) else 0
    return None


def run_memtrain(problem: Problem, run_dir: Path, exchange: str = "auto", workers: int | str = 2,
                 model: ModelConfig | None = None, cluster: str = "") -> dict[str, object]:
    from memtrain.train.server import train

    shutil.rmtree(run_dir, ignore_errors=True)
    started = time.perf_counter()
    try:
        train(job_for(problem, run_dir, exchange, workers, model, cluster))
        total = time.perf_counter() - started
        first = decided_at(run_dir) or 0
        records = [r for r in read_jsonl(run_dir / RUN_METRICS) if r.get("kind") == "update" and r["update"] >= first]
        events = (run_dir / RUN_EVENTS).read_text(encoding="utf-8").splitlines()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    pairs = [(a, b) for a, b in zip(records, records[1:], strict=False) if b["update"] == a["update"] + 1]
    walls = [b["time"] - a["time"] for a, b in pairs]
    computes = [b["compute_s"] for _, b in pairs]
    return timings(walls, computes, first_update=1, total_seconds=total, decided_at=first,
                   exchange=[line.split(" ", 1)[1] for line in events if "exchange" in line],
                   rounds=[line.split(" ", 1)[1] for line in events if "rounds:" in line])
