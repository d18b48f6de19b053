"""Sizes -> sync vs fixed staleness 1 (in the rounds, and streamed) vs async, without and with a straggler:
updates/s side by side, with staleness.

Every configuration is the same job (bench train's MLP, SGD, batch 512 cut into one task per worker) run in
a fresh process through the real ``train`` path (``python -m memtrain.benchmarks.async_bench SPEC``). Async
mode applies ``async_group = workers`` gradients per update, so an update covers as many rows as a
synchronous one and updates/s compare like for like. The straggler is the test hook
``MEMTRAIN_STRAGGLER``: one worker sleeps after each gradient so that it takes ``--straggler`` times as
long (a slower machine that does not take a core from the others). Updates/s is counted over the
steady part of each run (after ``--warmup`` updates): async updates arrive unevenly, so it is the count
over the time span, not a median of gaps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memtrain.benchmarks.memory import run_sampled
from memtrain.benchmarks.problem import BATCH, Problem
from memtrain.benchmarks.synthetic import CLASSES, FEATURES, mlp_shape, write_dataset
from memtrain.benchmarks.train_bench import (
    RUN_TIMEOUT,
    VAL_ROWS,
    machine,
    machine_caption,
    median,
    parse_sizes,
    window,
)
from memtrain.errors import InputError
from memtrain.faults import STRAGGLER_ENV
from memtrain.progress import BENCH_EVERY, Reporter, reporting
from memtrain.train.optim import OptimizerConfig

MAX_STALENESS = 4


def modes(workers: int) -> dict[str, dict[str, Any]]:
    """Label -> the TrainConfig fields of each configuration."""
    return {"sync": {}, "staleness 1": {"staleness": 1},
            "staleness 1, stream": {"staleness": 1, "staleness_in": "stream"},
            "async": {"mode": "async", "max_staleness": MAX_STALENESS, "async_group": workers}}


def add_arguments(parser: argparse._ActionsContainer) -> None:
    parser.add_argument("--straggler", type=float, default=3.0,
                        help="async: one worker takes this many times as long per gradient (default %(default)s)")


def run(args: argparse.Namespace) -> int:
    """``memtrain bench async``: the table (or JSON)."""
    sizes = parse_sizes(args.sizes)
    for size in sizes:
        updates, warmup = window(args, params=mlp_shape(size).params)
        if updates <= warmup + 2:
            raise InputError("--updates must exceed --warmup + 2", found=f"{updates} and {warmup}")
    if args.straggler < 1:
        raise InputError("--straggler is how many times slower one worker is: at least 1", found=args.straggler)
    if args.workers < 2:
        raise InputError("bench async needs at least 2 workers (one of them the straggler)", found=args.workers)
    scratch = Path(tempfile.mkdtemp(prefix="memtrain-bench-", dir=args.dir))
    try:
        load_before = os.getloadavg()
        runs = len(sizes) * 2 * args.repeats * len(modes(args.workers))  # 2: without and with the straggler
        with reporting("bench async", runs, plain_every=BENCH_EVERY) as progress:
            rows = [row for size in sizes for row in bench_size(size, args, scratch, progress)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = {"machine": machine() | {"loadavg_before": load_before, "loadavg_after": os.getloadavg()},
              "settings": {"sizes": sizes, "batch": BATCH, "workers": args.workers,
                           "window": {str(size): window(args, params=mlp_shape(size).params) for size in sizes},
                           "repeats": args.repeats, "straggler": args.straggler,
                           "optimizer": "sgd", "modes": modes(args.workers)},
              "results": rows, "checks": checks(rows)}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def bench_size(size: int, args: argparse.Namespace, scratch: Path, progress: Reporter) -> list[dict[str, Any]]:
    shape = mlp_shape(size)
    updates, warmup = window(args, params=shape.params)
    data = write_dataset(scratch / f"data-{shape.params}", updates * BATCH, VAL_ROWS, features=shape.features,
                         classes=shape.classes)
    problem = Problem(str(data), shape.hidden, updates, workers=args.workers)
    rows = []
    for straggler in (None, args.straggler):
        runs: dict[str, list[dict[str, Any]]] = {label: [] for label in modes(args.workers)}
        for repeat in range(args.repeats):  # alternating, so that a slow spell of the machine hits every mode
            for label, train in modes(args.workers).items():
                marker = scratch / f"straggler-{shape.params}-{repeat}-{label.replace(' ', '-')}"  # one per run
                env = {STRAGGLER_ENV: f"{straggler}:{marker}"} if straggler else {}
                slow = f", straggler {straggler:g}x" if straggler else ""
                progress.begin(f"{shape.params:,} params: {label}{slow}")
                runs[label].append(run_once(problem, scratch, args.exchange, train, env))
        rows += summarize(runs, warmup, shape.params, straggler, steady=updates - warmup)
    return rows


def run_once(problem: Problem, scratch: Path, exchange: str, train: dict[str, Any],
             env: dict[str, str]) -> dict[str, Any]:
    spec = {"problem": asdict(problem), "run_dir": str(scratch / "run"), "exchange": exchange, "train": train}
    environ = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")} | env
    result, _, _ = run_sampled("memtrain.benchmarks.async_bench", spec, what=f"bench async {train or 'sync'}",
                               timeout=RUN_TIMEOUT, env=environ)
    return result


def summarize(runs: dict[str, list[dict[str, Any]]], warmup: int, params: int,
              straggler: float | None, *, steady: int) -> list[dict[str, Any]]:
    rows = []
    for label, results in runs.items():
        rates = [steady_rate(r["stamps"], warmup) for r in results]
        staleness = [s for r in results for s in r["staleness"]]
        rows.append({"params": params, "straggler": straggler, "mode": label, "steady_updates": steady,
                     "updates_per_s": median(rates),
                     "straggled": [r["straggled"] for r in results],
                     "rates": rates, "samples_per_s": median(rates) * BATCH,
                     "staleness_mean": sum(staleness) / max(len(staleness), 1),
                     "staleness_max": max(staleness, default=0), "recomputed": sum(r["discarded"] for r in results),
                     "runs": len(results)})
    sync = rows[0]["updates_per_s"]
    for row in rows:
        row["vs_sync"] = row["updates_per_s"] / sync
    return rows


def steady_rate(stamps: list[float], warmup: int) -> float:
    """Updates per second after the first ``warmup`` updates."""
    steady = stamps[warmup:]
    return (len(steady) - 1) / max(steady[-1] - steady[0], 1e-9)


def checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets of docs/async.md, per size: async >= 1.5x sync with a straggler; staleness 1 >= sync without."""
    out = []
    for params in dict.fromkeys(row["params"] for row in rows):
        by = {(row["straggler"] is not None, row["mode"]): row for row in rows if row["params"] == params}
        out.append({"params": params, "check": "async vs sync, with a straggler", "target": 1.5,
                    "ratio": by[True, "async"]["vs_sync"]})
        out.append({"params": params, "check": "staleness 1 vs sync, no straggler", "target": 1.0,
                    "ratio": by[False, "staleness 1"]["vs_sync"]})
    for check in out:
        check["met"] = check["ratio"] >= check["target"]
    return out


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = report["settings"]
    table = Table(title=f"memtrain bench async: MLP {FEATURES}-H-{CLASSES}, SGD, batch {s['batch']}, {s['workers']} "
                        f"workers, {s['repeats']} runs of each mode (steady updates per run: see \"steady\"); "
                        f"straggler: one worker at 1/{s['straggler']:g} speed")
    table.caption = machine_caption(report["machine"])
    for name in ("params", "steady", "straggler", "mode", "updates/s", "runs (updates/s)", "÷ sync", "staleness mean",
                 "staleness max", "recomputed"):
        table.add_column(name, justify="left" if name in ("mode", "straggler", "runs (updates/s)") else "right")
    for row in report["results"]:
        table.add_row(f"{row['params']:,}", str(row["steady_updates"]),
                      f"1/{row['straggler']:g} speed" if row["straggler"] else "none",
                      row["mode"], f"{row['updates_per_s']:.1f}", " ".join(f"{r:.1f}" for r in row["rates"]),
                      f"{row['vs_sync']:.2f}", f"{row['staleness_mean']:.2f}", str(row["staleness_max"]),
                      str(row["recomputed"]))
    console = Console(width=150)
    console.print(table)
    for check in report["checks"]:
        console.print(f"{check['params']:,} params: {check['check']}: {check['ratio']:.2f}x "
                      f"(target >= {check['target']:g}x: {'met' if check['met'] else 'NOT met'})")


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One configuration's run (in this fresh process): the publication times and the lineage's staleness."""
    from memtrain.benchmarks.memtrain_run import job_for
    from memtrain.files import read_jsonl
    from memtrain.layout import RUN_METRICS
    from memtrain.train.lineage import read_lineage
    from memtrain.train.server import train

    marker = Path(os.environ.get(STRAGGLER_ENV, "").partition(":")[2] or os.devnull)
    free = not marker.exists()  # the straggler's part is still to be taken
    problem = spec["problem"]
    problem = Problem(**(problem | {"optimizer": OptimizerConfig(**problem["optimizer"])}))
    run_dir = Path(spec["run_dir"])
    shutil.rmtree(run_dir, ignore_errors=True)
    job = job_for(problem, run_dir, spec["exchange"], workers=problem.workers)
    job = dataclasses.replace(job, train=dataclasses.replace(job.train, **spec["train"]))
    try:
        train(job, quiet=True)
        records = [r for r in read_jsonl(run_dir / RUN_METRICS) if r.get("kind") == "update"]
        lineage = read_lineage(run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return {"stamps": [r["time"] for r in records], "staleness": [s for step in lineage.steps for s in step.staleness],
            "discarded": sum(step.discarded for step in lineage.steps),
            "straggled": free and marker.exists()}  # a worker of this run took the straggler's part


if __name__ == "__main__":
    print(json.dumps(run_child(json.loads(sys.argv[1]))), flush=True)
