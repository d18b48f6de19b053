"""Train a model on a prepared dataset, data-parallel across worker processes.

Examples:
  memtrain train jobs/examples/digits-mlp.toml
  memtrain train job.toml --set train.lr=0.01 --set train.epochs=5 --workers 2
  memtrain train --resume runs/digits-mlp            # continue from the newest complete checkpoint
  memtrain train --resume runs/digits-mlp --set train.epochs=60   # ... and train longer
  memtrain train job.toml --cluster tcp://scheduler-host:8786     # workers on a Dask cluster (docs/cluster.md)
  memtrain train job.toml --cluster local:2                       # a Dask cluster of 2 workers on this machine
  srun memtrain train job.toml --cluster slurm                    # every task of a Slurm job step (docs/cluster.md)
  memtrain train --replay runs/digits-async         # re-execute a run from its lineage, bitwise (docs/async.md)
  memtrain train jobs/examples/cartpole-ppo.toml    # reinforcement learning: a job with [env] (docs/rl.md)

On resume, the job must be the run's own: a change to the data, the model, the seed, the batches or the
optimizer is refused, and any other setting (epochs, lr, ...) changes only when named with --set on the
command line; the change is added to the run's history.jsonl, never written over its job.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from memtrain.cluster.address import parse_cluster
from memtrain.config import Job, load_job
from memtrain.errors import InputError, MemtrainError, plural
from memtrain.layout import RUN_JOB, RUN_LINEAGE
from memtrain.train.records.counters import ONE_PASS
from memtrain.train.records.lineage import read_lineage
from memtrain.train.records.metrics import SHOWN
from memtrain.train.records.run_dir import load_saved_job
from memtrain.train.server.server import TrainSummary, train
from memtrain.train.timing import UNTIMED, Timer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job", nargs="?", type=Path, help="job file (TOML); not needed with --resume RUN_DIR")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a job setting (value in TOML syntax); repeatable")
    parser.add_argument("--workers", type=int,
                        help="worker processes; 0: the server trains alone (default: train.workers, \"auto\")")
    parser.add_argument("--run-dir", type=Path, help="run directory (default: run.dir of the job)")
    parser.add_argument("--resume", nargs="?", const=True, default=False, metavar="RUN_DIR",
                        help="continue a run from its newest complete checkpoint")
    parser.add_argument("--replay", type=Path, metavar="RUN_DIR",
                        help="re-execute a run from its lineage into a new run directory (--run-dir; default "
                             "RUN_DIR-replay), checking every weight version against the recorded checksum")
    parser.add_argument("--cluster", metavar="ADDRESS",
                        help='run the workers on Dask: tcp://HOST:PORT of a scheduler, local:N, or slurm[:INTERFACE] '
                             'in every task of srun; "" for local processes (default: run.cluster of the job)')
    parser.add_argument("--verify", action="store_true", help="re-hash every dataset shard before training")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing run directory (only one that memtrain created)")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress bar, no epoch lines, no notes (warnings and the summary are still printed)")


def run(args: argparse.Namespace, timer: Timer = UNTIMED) -> int:
    """``memtrain train``; ``timer``: a measurement's timing hook (train/timing.py, benchmarks/first_job_items.py)."""
    from memtrain.rl.kind import wants_rl

    if wants_rl(args):  # a reinforcement-learning job ([env]) or run: memtrain/rl/server.py
        from memtrain.rl.server import run_command

        return run_command(args)
    if args.replay is not None:
        return _replay(args)
    job = _job(args)
    if job.run.cluster and parse_cluster(job.run.cluster, where="run.cluster").slurm:
        return _on_slurm(args, job)
    return _train(args, job, resume=bool(args.resume), overwrite=args.overwrite, timer=timer)


def _train(args: argparse.Namespace, job: Job, *, resume: bool, overwrite: bool, timer: Timer = UNTIMED) -> int:
    if overwrite and resume:
        raise InputError("--overwrite and --resume contradict each other",
                         hint=f"continue the run with `memtrain train --resume {job.run.dir}`, or start it over "
                              f"with `memtrain train {job.source or 'JOB.toml'} --run-dir {job.run.dir} --overwrite`")
    asked = {item.partition("=")[0].strip() for item in args.overrides}
    try:
        summary = train(job, resume_run=resume, verify=args.verify, overwrite=overwrite, asked=asked,
                        quiet=args.quiet, timer=timer)
    except MemtrainError as exc:
        _name_resume(exc, job.run.dir)
        raise
    _print_summary(summary)
    return 0


def _on_slurm(args: argparse.Namespace, job: Job) -> int:
    """``--cluster slurm`` (cluster/slurm.py): rank 0 starts a Dask scheduler and trains on it, the other ranks
    run its workers. A run directory that already holds a run (a requeued job, the script submitted again) is
    resumed, with the saved job; ``--overwrite`` applies only to a job's first start, never to a requeue."""
    from memtrain.cluster.slurm import serve, slurm_task, stop_requests, work, worker_layout

    address = parse_cluster(job.run.cluster, where="run.cluster")
    task = slurm_task()
    with stop_requests() as stopped:
        if task.rank > 0:  # one Dask worker for the node: its processes are threads or worker processes
            workers, node, why = worker_layout(task, workers=job.train.workers, blas_threads=job.train.blas_threads,
                                               model_kind=job.model.kind)
            print(f"memtrain train: rank {task.rank}: " + (f"one Dask worker, a node of {node} processes ({why})"
                  if node else f"{workers} Dask worker(s), one per process ({why})"), file=sys.stderr, flush=True)
            return work(task, address, job.run.dir, workers, stopped, node)

        def on(scheduler: str) -> int:
            resume = bool(args.resume) or task.requeued or ((job.run.dir / RUN_JOB).is_file() and not args.overwrite)
            saved = job
            if resume and not args.resume:
                saved = load_saved_job(job.run.dir, args.overrides, workers=args.workers, values=_cluster(args))
            moved = dataclasses.replace(saved, run=dataclasses.replace(saved.run, cluster=scheduler))
            return _train(args, moved, resume=resume, overwrite=args.overwrite and not resume)

        return serve(task, address, job.run.dir, on, stopped)


def _replay(args: argparse.Namespace) -> int:
    if args.job is not None or args.resume or args.overrides or args.cluster:
        raise InputError("--replay takes a run directory and nothing that changes the job",
                         expected="memtrain train --replay RUN_DIR [--run-dir OUT] [--workers N] [--overwrite]",
                         hint="a replay runs the recorded job exactly; the worker count does not change its results")
    source = args.replay.resolve()
    if not (source / RUN_JOB).is_file():
        raise InputError("--replay needs the run directory of a memtrain train run", path=source,
                         expected=f"a directory holding {RUN_JOB} and {RUN_LINEAGE}",
                         found="nothing there" if not source.exists() else f"no {RUN_JOB}")
    job = load_saved_job(source, workers=args.workers)
    lineage = read_lineage(source)
    if lineage.other or not lineage.steps:
        raise InputError("this run has no updates to replay" + (" (an additive model is solved in one pass)"
                                                               if lineage.other else ""), path=lineage.path)
    target = (args.run_dir or source.with_name(source.name + "-replay")).resolve()
    if target == source:
        raise InputError("the replay needs its own run directory", path=target, hint="give --run-dir OUT")
    job = dataclasses.replace(job, run=dataclasses.replace(job.run, dir=target))
    summary = train(job, overwrite=args.overwrite, quiet=args.quiet, replay=lineage)
    _print_summary(summary)
    print(f"replayed {source}: all {len(lineage.steps)} weight versions match the recorded checksums", flush=True)
    return 0


def _name_resume(exc: MemtrainError, run_dir: Path) -> None:
    """A failure after the run directory was made says how to continue it (a refusal, exit 2, says its own)."""
    if exc.exit_code == 1 and (run_dir / RUN_JOB).is_file() and "memtrain " not in (exc.hint or ""):
        exc.hint = (exc.hint + "; then r" if exc.hint else "R") + f"esume with: memtrain train --resume {run_dir}"


def _job(args: argparse.Namespace):  # noqa: ANN202 - returns config.Job
    if args.workers is not None and args.workers < 0:
        raise InputError("--workers must be 0 (the server trains alone) or more", found=args.workers)
    if isinstance(args.resume, str):
        if args.job is not None:
            raise InputError("give either a job file or --resume RUN_DIR, not both")
        if args.run_dir is not None or any(item.partition("=")[0].strip() == "run.dir" for item in args.overrides):
            raise InputError("--resume RUN_DIR continues that directory: --run-dir and run.dir do not apply",
                             hint=f"memtrain train --resume {args.resume}")
        return load_saved_job(Path(args.resume).resolve(), args.overrides, workers=args.workers,
                              values=_cluster(args))
    if args.job is None:
        raise InputError("a job file is needed", hint="memtrain train JOB.toml, or memtrain train --resume RUN_DIR")
    return load_job(args.job, args.overrides, workers=args.workers, run_dir=args.run_dir, values=_cluster(args))


def _cluster(args: argparse.Namespace) -> dict[str, str]:
    """``--cluster`` as a job value: on resume it moves a run onto a cluster, or ("") back to this machine."""
    return {} if args.cluster is None else {"run.cluster": args.cluster}


def _print_summary(summary: TrainSummary) -> None:
    final, best = summary.final, summary.best or {}
    done = ONE_PASS if summary.one_pass else plural(summary.epochs, "epoch")
    lines = [f"done: {done}, weight version {summary.version}, {summary.seconds:.1f} s"]
    # an additive model's one solve is its final and its best result, and it has no epoch to name
    shown = (("result", final),) if summary.one_pass else (("final", final), ("best", best))
    for label, record in shown:
        metrics = [f"{key} {record[key]:.4f}" for key in SHOWN if key in record]
        if metrics:
            where = "" if summary.one_pass else f" (epoch {record.get('epoch')})"
            lines.append(f"{label}{where}: " + "  ".join(metrics))
    if summary.stopped_early:
        waited = plural(summary.epochs - best["epoch"], "epoch")
        lines.append(f"stopped early: no better {summary.monitor} for {waited} after epoch {best['epoch']}")
    if summary.worker_deaths:
        lines.append(f"workers that died and were replaced: {summary.worker_deaths}")
    lines.append(f"run directory: {summary.run_dir}")
    lines.append(f"inspect it with: memtrain inspect {summary.run_dir}")
    print("\n".join(lines), file=sys.stdout, flush=True)
