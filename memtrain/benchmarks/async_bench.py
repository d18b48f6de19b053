"""Sizes -> sync vs fixed staleness 1 (in the rounds, and streamed) vs async, without and with a straggler:
updates/s side by side, with staleness.

Every configuration is the same job (bench train's MLP, SGD, batch 512 cut into one task per worker) run in
a fresh process through the real ``train`` path (``python -m memtrain.benchmarks.async_bench SPEC``). Async
mode applies ``async_group = workers`` gradients per update, so an update covers as many rows as a
synchronous one and updates/s compare like for like. The straggler is the test hook
``MEMTRAIN_STRAGGLER``: one worker sleeps after each gradient so that it takes ``--straggler`` times as
long (a slower machine that does not take a core from the others); or, with ``--straggler-from outside``,
one worker is stopped from outside (SIGSTOP / SIGCONT, outside_straggler.py) for all but 1/``--straggler``
of the time, at whatever point of its work it is (the straggler of issue 32). Two rates per run: the whole run's
(its updates over the life of its process, timed from outside: start-up included, as a user's job is
timed; the targets are checked on it) and the steady part's (after ``--warmup`` updates: async updates
arrive unevenly, so it is the count over the time span, not a median of gaps). The modes alternate
(compare.py), ``--repeats`` times; each rate is the median with its range, and each ratio to sync is
taken repeat by repeat (the runs made side by side), then its median and range: a target is met when
the median meets it. (Until issue 32 the ratio was of the median rates, over the steady part only.)

Every run is checkout_run.py started as a script with this checkout on PYTHONPATH; ``--against PATH`` runs
every mode again with PATH's memtrain instead (the same job: train.shuffle = "batches", a key passed only
to a memtrain that knows it), as the modes "sync @COMMIT" and so on, interleaved with this checkout's, and
prints per mode the time of an update here over there, repeat by repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from memtrain.benchmarks.compare import Spread, Target, interleaved, pairwise
from memtrain.benchmarks.memtrain_run import spec_for
from memtrain.benchmarks.outside_straggler import OutsideStraggler
from memtrain.benchmarks.problem import BATCH, Problem
from memtrain.benchmarks.synthetic import CLASSES, FEATURES, mlp_shape, write_dataset
from memtrain.benchmarks.train_bench import (
    VAL_ROWS,
    Checkout,
    machine,
    machine_caption,
    other_checkout,
    parse_shuffles,
    parse_sizes,
    run_checkout,
    this_checkout,
    window,
)
from memtrain.errors import InputError
from memtrain.faults import STRAGGLER_ENV
from memtrain.progress import BENCH_EVERY, Reporter, reporting

MAX_STALENESS = 4
HOW = {"hook": "sleeping after each gradient", "outside": "stopped from outside"}  # --straggler-from, in the title
# the targets of docs/async.md, checked on whole runs (start-up included)
TARGETS = {(True, "async"): Target(name="async vs sync, with a straggler", at_least=1.5),
           (False, "staleness 1"): Target(name="staleness 1 vs sync, no straggler", at_least=1.0)}


def modes(workers: int) -> dict[str, dict[str, Any]]:
    """Label -> the TrainConfig fields of each configuration."""
    return {"sync": {}, "staleness 1": {"staleness": 1},
            "staleness 1, stream": {"staleness": 1, "staleness_in": "stream"},
            "async": {"mode": "async", "max_staleness": MAX_STALENESS, "async_group": workers}}


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """``bench async``'s own options (with train_bench.add_run_arguments and bench.py's --dir, --repeats, --json)."""
    parser.add_argument("--shuffle", default="batches",
                        help="memtrain's train.shuffle: bench async runs only the batches order (the order of the "
                             "targets in docs/async.md)")
    parser.add_argument("--straggler", type=float, default=3.0,
                        help="one worker takes this many times as long per gradient (default %(default)s)")
    parser.add_argument("--straggler-from", choices=("hook", "outside"), default="outside",
                        help="how the straggler is slowed: 'hook', it sleeps after each gradient; 'outside', "
                             "it is stopped from outside (SIGSTOP) for all but 1/--straggler of the time, at any "
                             "point of its work (default %(default)s)")


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
    if args.repeats < 1:
        raise InputError("--repeats must be at least 1", found=args.repeats)
    shuffles = parse_shuffles(getattr(args, "shuffle", "batches"))
    if shuffles != ["batches"]:
        raise InputError("bench async runs the batches order (the order of the targets in docs/async.md)",
                         where="--shuffle", found=",".join(shuffles))
    checkouts = [this_checkout()] + [other_checkout(path) for path in getattr(args, "against", [])]
    scratch = Path(tempfile.mkdtemp(prefix="memtrain-bench-", dir=args.dir))
    try:
        load_before = os.getloadavg()
        runs = len(sizes) * 2 * args.repeats * len(modes(args.workers)) * len(checkouts)  # 2: with/without straggler
        with reporting("bench async", runs, plain_every=BENCH_EVERY) as progress:
            rows = [row for size in sizes for row in bench_size(size, args, scratch, progress, checkouts)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = {"machine": machine() | {"loadavg_before": load_before, "loadavg_after": os.getloadavg()},
              "settings": {"sizes": sizes, "batch": BATCH, "workers": args.workers,
                           "window": {str(size): window(args, params=mlp_shape(size).params) for size in sizes},
                           "repeats": args.repeats, "straggler": args.straggler,
                           "straggler_from": args.straggler_from,
                           "optimizer": "sgd", "modes": modes(args.workers),
                           "against": [str(c.root) for c in checkouts[1:]]},
              "results": rows, "checks": checks(rows), "against": against_ratios(rows, checkouts)}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def labelled(mode: str, checkout: Checkout) -> str:
    """A mode's label: as named for this checkout, ``sync @COMMIT`` for another (``--against``)."""
    return mode if checkout.this else f"{mode} @{checkout.commit}"


def bench_size(size: int, args: argparse.Namespace, scratch: Path, progress: Reporter,
               checkouts: list[Checkout]) -> list[dict[str, Any]]:
    shape = mlp_shape(size)
    updates, warmup = window(args, params=shape.params)
    data = write_dataset(scratch / f"data-{shape.params}", updates * BATCH, VAL_ROWS, features=shape.features,
                         classes=shape.classes)
    problem = Problem(str(data), shape.hidden, updates, workers=args.workers)
    configurations = {labelled(mode, c): (train, c) for c in checkouts for mode, train in modes(args.workers).items()}
    rows = []
    for straggler in (None, args.straggler):
        def run(label: str, repeat: int, straggler: float | None = straggler) -> dict[str, Any]:
            train, checkout = configurations[label]
            slow = f", straggler {straggler:g}x" if straggler else ""
            progress.begin(f"{shape.params:,} params: {label}{slow}")
            if straggler and args.straggler_from == "outside":
                return run_once(problem, scratch, args.exchange, train, {}, checkout, stopped=1 - 1 / straggler)
            marker = scratch / f"straggler-{shape.params}-{repeat}-{label.replace(' ', '-')}"  # one per run
            env = {STRAGGLER_ENV: f"{straggler}:{marker}"} if straggler else {}
            return run_once(problem, scratch, args.exchange, train, env, checkout, marker=marker if straggler else None)

        runs = interleaved(list(configurations), args.repeats, run)
        for checkout in checkouts:
            mine = {label: runs[label] for label, (_, c) in configurations.items() if c is checkout}
            rows += [row | {"checkout": checkout.commit, "this": checkout.this}
                     for row in summarize(mine, warmup, shape.params, straggler, steady=updates - warmup)]
    return rows


def run_once(problem: Problem, scratch: Path, exchange: str, train: dict[str, Any], env: dict[str, str],
             checkout: Checkout, *, stopped: float | None = None, marker: Path | None = None) -> dict[str, Any]:
    """One configuration in a fresh process (checkout_run.py, importing ``checkout``'s memtrain);
    ``wall_seconds`` is that process's life (start-up included). ``stopped``: one worker is stopped from outside
    for that fraction of the time; ``marker``: the hook straggler's file, made by the worker that takes its part."""
    spec = spec_for(problem, scratch / "run", exchange, workers=problem.workers, portable=True, train=train) | {
        "lineage": True, "quiet": True}
    environ = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")} | env
    stragglers: list[OutsideStraggler] = []

    def straggle(pid: int) -> Any:
        stragglers.append(OutsideStraggler(pid, stopped or 0.0))
        stragglers[0].start()
        return stragglers[0].finish

    free = marker is not None and not marker.exists()  # the straggler's part is still to be taken
    started = time.perf_counter()
    raw, _, _ = run_checkout(checkout, spec, scratch, what=f"bench async {train or 'sync'}", env=environ,
                             alongside=straggle if stopped else None)
    wall = time.perf_counter() - started
    if stopped:
        stragglers[0].check(f"bench async {train or 'sync'}")  # a run with no worker stopped measures nothing
    result = {"stamps": [r["time"] for r in raw["records"]], "staleness": raw["staleness"],
              "discarded": raw["discarded"], "memtrain_file": raw["memtrain_file"],
              "wall_seconds": wall,
              "straggled": True if stopped else free and marker.exists()}
    return result


def against_ratios(rows: list[dict[str, Any]], checkouts: list[Checkout]) -> list[dict[str, Any]]:
    """Per size, straggler and mode, for each other checkout: the time of an update here over there (whole runs,
    repeat by repeat): above 1, this checkout is slower."""
    out = []
    here = [row for row in rows if row["this"]]
    for other in checkouts[1:]:
        for row in here:
            there = next(r for r in rows if r["checkout"] == other.commit and not r["this"] and
                         r["params"] == row["params"] and r["straggler"] == row["straggler"] and
                         r["mode"] == labelled(row["mode"], other))
            ratio = pairwise(there["whole"]["runs"], row["whole"]["runs"])
            out.append({"params": row["params"], "straggler": row["straggler"], "mode": row["mode"],
                        "commit": other.commit, "ratio": ratio.as_dict() if ratio else None})
    return out


def summarize(runs: dict[str, list[dict[str, Any]]], warmup: int, params: int,
              straggler: float | None, *, steady: int) -> list[dict[str, Any]]:
    rows = []
    for label, results in runs.items():
        whole = [len(r["stamps"]) / r["wall_seconds"] for r in results]
        rates = [steady_rate(r["stamps"], warmup) for r in results]
        staleness = [s for r in results for s in r["staleness"]]
        rows.append({"params": params, "straggler": straggler, "mode": label, "steady_updates": steady,
                     "updates": len(results[0]["stamps"]), "whole": Spread.of(whole).as_dict(),
                     "steady": Spread.of(rates).as_dict(), "updates_per_s": Spread.of(whole).median,
                     "straggled": [r["straggled"] for r in results],
                     "staleness_mean": sum(staleness) / max(len(staleness), 1),
                     "staleness_max": max(staleness, default=0), "recomputed": sum(r["discarded"] for r in results),
                     "runs": len(results), "imported_from": sorted({r["memtrain_file"] for r in results
                                                                    if "memtrain_file" in r})})
    sync = rows[0]
    for row in rows:
        row["vs_sync"] = pairwise(row["whole"]["runs"], sync["whole"]["runs"]).as_dict()
        row["vs_sync_steady"] = pairwise(row["steady"]["runs"], sync["steady"]["runs"]).as_dict()
    return rows


def steady_rate(stamps: list[float], warmup: int) -> float:
    """Updates per second after the first ``warmup`` updates."""
    steady = stamps[warmup:]
    return (len(steady) - 1) / max(steady[-1] - steady[0], 1e-9)


def checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The targets of docs/async.md, per size, on whole runs: async >= 1.5x sync with a straggler; staleness 1
    >= sync without. Met when the median ratio (repeat by repeat) meets the target."""
    out = []
    for params in dict.fromkeys(row["params"] for row in rows):
        by = {(row["straggler"] is not None, row["mode"]): row for row in rows
              if row["params"] == params and row.get("this", True)}
        for key, target in TARGETS.items():
            ratio = Spread.of(by[key]["vs_sync"]["runs"])
            out.append({"params": params, "check": target.name, "target": target.at_least,
                        "ratio": ratio.as_dict(), "met": target.met(ratio), "verdict": target.verdict(ratio)})
    return out


def print_table(report: dict[str, Any]) -> None:
    """The report for people: the table (split to fit a narrow terminal: render.print_table), the machine, the
    verdicts."""
    from rich.text import Text

    from memtrain.inspection.render import make_console, table
    from memtrain.inspection.render import print_table as print_grid

    s = report["settings"]
    title = (f"memtrain bench async: MLP {FEATURES}-H-{CLASSES}, SGD, batch {s['batch']}, {s['workers']} workers, "
             f"median (min-max) of {s['repeats']} interleaved runs of each mode, ratios to sync repeat by repeat; "
             f"whole run: from process start to exit; straggler: one worker at 1/{s['straggler']:g} speed "
             f"({HOW[s['straggler_from']]})")
    columns = ("params", "updates", "straggler", "mode", "updates/s, whole run", "÷ sync", "updates/s, steady",
               "÷ sync, steady", "staleness mean", "staleness max", "recomputed")
    rows = [(f"{row['params']:,}", f"{row['updates']} ({row['steady_updates']} steady)",
             f"1/{row['straggler']:g} speed" if row["straggler"] else "none", row["mode"],
             _text(row["whole"], 1), _text(row["vs_sync"]), _text(row["steady"], 1),
             _text(row["vs_sync_steady"]), f"{row['staleness_mean']:.2f}", str(row["staleness_max"]),
             str(row["recomputed"])) for row in report["results"]]
    console = make_console()
    print_grid(console, table(title, columns, rows, right=set(columns) - {"mode", "straggler"},
                                             keys=4))
    console.print(Text(machine_caption(report["machine"])))
    for check in report["checks"]:
        console.print(Text(f"{check['params']:,} params: {check['verdict']}"))
    for other in report.get("against", []):
        slow = f", straggler 1/{other['straggler']:g} speed" if other["straggler"] else ""
        ratio = _text(other["ratio"]) if other["ratio"] else "-"
        console.print(Text(f"{other['params']:,} params, {other['mode']}{slow}: time of an update, this checkout / "
                           f"{other['commit']} (whole runs, the same job) = {ratio} (above 1: this checkout is "
                           "slower)"))


def _text(spread: dict[str, Any], digits: int = 2) -> str:
    return Spread.of(spread["runs"]).text(digits)
