"""A benchmark problem -> a memtrain job run through the real ``train`` path -> per-update wall and compute times.

The times come from the run's own ``metrics.jsonl``: one record per update, stamped when the update's
version is published, so they include everything the rounds do (gradients, step, publication,
checksums, logs). Worker compute time is the slowest participant's gradient time of the update, as it
measured it (``compute_s``).

The job runs ``problem.epochs`` epochs to its end, as a user's job does: with ``train.workers = "auto"``
it first decides where its rounds run (train/server/placement.py), and that trial is part of the run. The
harness (train_bench.py) compares a run of E epochs with one of 2E, so that what a run pays once (start-up,
the placement's trial, the last checkpoint) cancels; the per-update records here give the compute time
and where the rounds ran. The job itself is built and run by checkout_run.py, which can run another
checkout's memtrain the same way (``bench train --against``). (Until issue 32 an "auto" run was stopped by
SIGINT once enough updates had followed its decision, and timed from the decision on: the trial's updates
were never counted.)
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from memtrain.benchmarks import checkout_run
from memtrain.benchmarks.problem import Problem, timings
from memtrain.config import Job, ModelConfig

NEVER = checkout_run.NEVER


def spec_for(problem: Problem, run_dir: Path, exchange: str = "auto", workers: int | str = 2,
             model: ModelConfig | None = None, cluster: str = "", *, portable: bool = False,
             train: dict[str, Any] | None = None) -> dict[str, Any]:
    """The job of ``problem`` as checkout_run.py's plain spec. ``portable``: a job any checkout accepts, the
    same work for all (``problem.shuffle`` must be "batches", the order before train.shuffle existed: it is
    passed only to a memtrain that knows the key); ``train``: more [train] fields (bench async's modes)."""
    if portable and problem.shuffle != "batches":
        raise ValueError(f"a job for another checkout reads the batches order, not {problem.shuffle!r}")
    shuffle = {"shuffle": problem.shuffle}
    return {"dataset": str(problem.dataset), "hidden": problem.hidden, "epochs": problem.epochs,
            "batch": problem.batch, "tasks": problem.workers, "workers": workers, "seed": problem.seed,
            "optimizer": asdict(problem.optimizer), "exchange": exchange, "cluster": cluster,
            "run_dir": str(run_dir), "train": (train or {}) | ({} if portable else shuffle),
            "train_if_known": shuffle if portable else {},
            "model": {"kind": model.kind, "options": model.options} if model is not None else None}


def job_for(problem: Problem, run_dir: Path, exchange: str = "auto", workers: int | str = 2,
            model: ModelConfig | None = None, cluster: str = "") -> Job:
    """The memtrain job that computes exactly what the peers compute (memtrain's MLP unless ``model``)."""
    return checkout_run.job_for(spec_for(problem, run_dir, exchange, workers, model, cluster))


def run_memtrain(problem: Problem, run_dir: Path, exchange: str = "auto", workers: int | str = 2,
                 model: ModelConfig | None = None, cluster: str = "") -> dict[str, object]:
    return measured(checkout_run.run_job(spec_for(problem, run_dir, exchange, workers, model, cluster)))


def measured(result: dict[str, Any]) -> dict[str, object]:
    """checkout_run.py's result -> the per-update record every method returns (problem.timings): the gaps
    between consecutive updates after the placement's decision, and their compute times; the run's validation
    passes and last figures as the peers report theirs (``val_passes``, ``final``)."""
    first = result["decided_at"]
    records = [r for r in result["records"] if r["update"] >= first]
    pairs = [(a, b) for a, b in zip(records, records[1:], strict=False) if b["update"] == a["update"] + 1]
    walls = [b["time"] - a["time"] for a, b in pairs]
    computes = [b["compute_s"] for _, b in pairs]
    events = result["events"]
    return timings(walls, computes, first_update=1, total_seconds=result["total_seconds"], decided_at=first,
                   exchange=[line.split(" ", 1)[1] for line in events if "exchange" in line],
                   rounds=[line.split(" ", 1)[1] for line in events
                           if "rounds:" in line or "rounds in the server:" in line],
                   memtrain_file=result["memtrain_file"], val_passes=result.get("val_passes"),
                   final=result.get("final", {}))
