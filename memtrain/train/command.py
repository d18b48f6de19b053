"""Train a model on a prepared dataset, data-parallel across worker processes.

Examples:
  memtrain train jobs/examples/digits-mlp.toml
  memtrain train job.toml --set train.lr=0.01 --set train.epochs=5 --workers 2
  memtrain train --resume runs/digits-mlp            # continue from the newest complete checkpoint
  memtrain train --resume runs/digits-mlp --set train.epochs=60   # ... and train longer
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memtrain.config import load_job, load_saved_job
from memtrain.errors import InputError
from memtrain.train.server import TrainSummary, train


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", type=Path, help="job file (TOML); not needed with --resume RUN_DIR")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a job setting (value in TOML syntax); repeatable")
    parser.add_argument("--workers", type=int,
                        help="worker processes; 0: the server trains alone (default: train.workers, \"auto\")")
    parser.add_argument("--run-dir", type=Path, help="run directory (default: run.dir of the job)")
    parser.add_argument("--resume", nargs="?", const=True, default=False, metavar="RUN_DIR",
                        help="continue a run from its newest complete checkpoint")
    parser.add_argument("--verify", action="store_true", help="re-hash every dataset shard before training")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing run directory (only one that memtrain created)")


def run(args: argparse.Namespace) -> int:
    job = _job(args)
    if args.overwrite and args.resume:
        raise InputError("--overwrite and --resume contradict each other")
    summary = train(job, resume_run=bool(args.resume), verify=args.verify, overwrite=args.overwrite)
    _print_summary(summary)
    return 0


def _job(args: argparse.Namespace):  # noqa: ANN202 - returns config.Job
    if args.workers is not None and args.workers < 0:
        raise InputError("--workers must be 0 (the server trains alone) or more", found=args.workers)
    if isinstance(args.resume, str):
        if args.job is not None:
            raise InputError("give either a job file or --resume RUN_DIR, not both")
        return load_saved_job(Path(args.resume).resolve(), args.overrides, workers=args.workers)
    if args.job is None:
        raise InputError("a job file is needed", hint="memtrain train JOB.toml, or memtrain train --resume RUN_DIR")
    return load_job(args.job, args.overrides, workers=args.workers, run_dir=args.run_dir)


def _print_summary(summary: TrainSummary) -> None:
    final, best = summary.final, summary.best or {}
    lines = [f"done: {summary.epochs} epochs, weight version {summary.version}, {summary.seconds:.1f} s"]
    for label, record in (("final", final), ("best", best)):
        metrics = [f"{key} {record[key]:.4f}" for key in ("val_loss", "val_accuracy") if key in record]
        if metrics:
            lines.append(f"{label} (epoch {record.get('epoch')}): " + "  ".join(metrics))
    if summary.worker_deaths:
        lines.append(f"workers that died and were replaced: {summary.worker_deaths}")
    lines.append(f"run directory: {summary.run_dir}")
    lines.append(f"inspect it with: memtrain inspect {summary.run_dir}")
    print("\n".join(lines), file=sys.stdout, flush=True)
