"""Sizes + methods -> the training benchmark tables (samples/s, overhead, peak memory, ratios), or JSON.

For each parameter count a synthetic dataset is written once; then every method runs in a fresh
process, the methods alternating (memtrain, one process, pickle, shared memory, BLAS on every core,
then again), and their steady-state updates are pooled. The first ``warmup`` updates of every run are
left out: they pay for process start, imports and first page faults, which a long job pays once
(memtrain's are counted from the update where it decided where its rounds run). Each ratio is given
with its spread over the repeats (each repeat compares runs made side by side), and per size the
ratio to the best of the single-machine baselines. Then the README's first command, memtrain against
a plain numpy loop of the same model (memtrain/benchmarks/first_job.py).

With torch installed, the same MLP as a torch module is measured too, side by side (torch_peers.py):
memtrain with ``kind = "torch"`` against torch DDP on gloo and one torch process on every core; those
rows' ratios are memtrain-torch's samples/s over theirs. Memory is the peak of the summed VmHWM
(shared pages counted per process) and the peak of the summed PSS (shared pages counted once).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from memtrain.benchmarks import first_job, larger_than_ram
from memtrain.benchmarks.memory import run_sampled
from memtrain.benchmarks.problem import BATCH, Problem
from memtrain.benchmarks.runner import CLUSTER_METHOD, FIRST_JOB, FORCED, METHODS, TORCH_METHODS
from memtrain.benchmarks.synthetic import CLASSES, FEATURES, mlp_shape, write_dataset
from memtrain.errors import InputError
from memtrain.progress import BENCH_EVERY, Reporter, reporting

LABELS = {"memtrain": "memtrain", "one_process": "one process, 1 thread", "pickle_queue": "pickle via Queue",
          "shared_memory": "shared_memory", "one_process_blas": "one process, all-core BLAS",
          "memtrain_server": "memtrain, train.workers = 0", "memtrain_workers": "memtrain, train.workers = N",
          "first_memtrain": "memtrain train", "first_loop": "plain numpy loop",
          "torch_memtrain": "memtrain, torch module", "torch_ddp": "torch DDP, gloo",
          "torch_all_cores": "one torch process, all cores", CLUSTER_METHOD: "memtrain on Dask"}
BASES = {"memtrain": "memtrain", "torch": "torch_memtrain"}  # the row each method's ratio is taken against
BASELINES = ("one_process", "one_process_blas", "shared_memory")  # what a user on one machine would otherwise do
VAL_ROWS = BATCH
RUN_TIMEOUT = 1800.0  # seconds for one method at one size; a hung run fails the benchmark, not the machine


UPDATES, WARMUP = 40, 3  # per run: updates, and the first ones left out of the rate
# bench async at small sizes: an update takes a few ms there, and a rate over 37 of them (~0.1 s) swings with
# every wake-up of the machine (async's runs at 1e4 gave 0.92x and 1.36x synchronous over 20 and 180 updates)
SMALL_PARAMS, SMALL_UPDATES, SMALL_WARMUP = 2e5, 200, 20


def window(args: argparse.Namespace, *, params: int | None) -> tuple[int, int]:
    """(updates, warmup) of one run: as given, else the defaults (bench async's longer ones for a model of at
    most SMALL_PARAMS ``params``)."""
    small = params is not None and params <= SMALL_PARAMS
    return (args.updates if args.updates is not None else SMALL_UPDATES if small else UPDATES,
            args.warmup if args.warmup is not None else SMALL_WARMUP if small else WARMUP)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", default="1e4,1e5,1e6,1e7", help="parameter counts (default %(default)s)")
    parser.add_argument("--updates", type=int, help=f"updates per run (default {UPDATES}; bench async: "
                                                     f"{SMALL_UPDATES} up to {SMALL_PARAMS:.0e} parameters)")
    parser.add_argument("--warmup", type=int, help=f"updates per run left out (default {WARMUP}; bench async: "
                                                    f"{SMALL_WARMUP} up to {SMALL_PARAMS:.0e} parameters)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every method per size (default %(default)s)")
    parser.add_argument("--workers", type=int, default=2,
                        help="worker processes of the peers, and tasks per update (default %(default)s)")
    parser.add_argument("--methods", help=f"comma-separated subset of {','.join(METHODS + TORCH_METHODS + FORCED)} "
                                          f"(default: {','.join(METHODS)}, and the torch ones when torch is installed)")
    parser.add_argument("--first-job", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the README's first command against a plain numpy loop (default: yes)")
    parser.add_argument("--exchange", default="auto", help="memtrain's run.exchange (default %(default)s)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--cluster", metavar="ADDRESS", default="",
                        help="also run memtrain with its workers on Dask (tcp://HOST:PORT or local:N), to compare "
                             "its per-update overhead with the local exchange")
    larger_than_ram.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    """``memtrain bench train``: the table (or JSON); ``--larger-than-ram``: the memory-limit scenario.

    ``args.dir`` (optional) is where the temporary datasets and runs go.
    """
    sizes, methods = parse_sizes(args.sizes), parse_methods(args.methods or default_methods())
    if getattr(args, "cluster", ""):
        from memtrain.cluster.address import parse_cluster

        parse_cluster(args.cluster)
        methods.append(CLUSTER_METHOD)
    args.updates, args.warmup = window(args, params=None)
    if args.updates <= args.warmup + 1:
        raise InputError("--updates must exceed --warmup + 1", found=f"{args.updates} and {args.warmup}")
    scratch = Path(tempfile.mkdtemp(prefix="memtrain-bench-", dir=getattr(args, "dir", None)))
    try:
        if args.larger_than_ram:
            larger_than_ram.print_report(larger_than_ram.run_scenario(args, scratch), args.json)
            return 0
        load_before = os.getloadavg()
        first_too = args.first_job and first_job.available()
        runs = (len(sizes) * len(methods) + first_too * len(FIRST_JOB)) * args.repeats
        with reporting("bench train", runs, plain_every=BENCH_EVERY) as progress:
            rows = [row for size in sizes for row in bench_size(size, methods, args, scratch, progress)]
            first = bench_first_job(args.repeats, scratch, progress) if first_too else []
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = {"machine": machine() | {"loadavg_before": load_before, "loadavg_after": os.getloadavg()},
              "settings": settings(args, sizes, methods), "results": rows, "baselines": best_of(rows),
              "first_job": first}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(float(part)) for part in text.split(",") if part.strip()]
    except ValueError:
        raise InputError("--sizes takes parameter counts such as 1e5,1e6", found=text) from None
    if not sizes or min(sizes) < 100:
        raise InputError("--sizes needs parameter counts of at least 100", found=text)
    return sizes


def default_methods() -> str:
    try:
        import torch  # noqa: F401 - only whether it is there
    except ImportError:
        print('bench train: torch is not installed; the torch comparison is left out '
              '(pip install "memtrain[torch]")', file=sys.stderr)
        return ",".join(METHODS)
    return ",".join(METHODS + TORCH_METHODS)


def parse_methods(text: str) -> list[str]:
    methods = [part.strip() for part in text.split(",") if part.strip()]
    known = METHODS + TORCH_METHODS + FORCED
    unknown = [m for m in methods if m not in known]
    if unknown or not methods:
        raise InputError("unknown --methods", expected=", ".join(known), found=", ".join(unknown) or text)
    return methods


def family(method: str) -> str:
    return "torch" if method in TORCH_METHODS else "memtrain"


def bench_size(size: int, methods: list[str], args: argparse.Namespace, scratch: Path,
               progress: Reporter) -> list[dict[str, Any]]:
    shape = mlp_shape(size)
    data = write_dataset(scratch / f"data-{shape.params}", args.updates * BATCH, VAL_ROWS, features=shape.features,
                         classes=shape.classes)
    problem = Problem(str(data), shape.hidden, args.updates, workers=args.workers)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in methods}
    for _ in range(args.repeats):
        for method in methods:
            progress.begin(f"{shape.params:,} params: {LABELS.get(method, method)}")
            runs[method].append(run_once(method, problem, scratch, args.exchange, cluster=getattr(args, "cluster", "")))
    rows = [summarize(method, runs[method], args.warmup) | {"params": shape.params, "shape": asdict(shape)}
            for method in methods]
    for row in rows:
        base = next((r for r in rows if r["method"] == BASES[family(row["method"])]), None)
        row["memtrain_ratio"] = base["samples_per_s"] / row["samples_per_s"] if base else None
        row["ratio_runs"] = [a / b for a, b in zip(base["runs_samples_per_s"], row["runs_samples_per_s"],
                                                   strict=True)] if base else []
    return rows


def best_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size: memtrain against the best of the single-machine baselines, run by run."""
    out = []
    for params in dict.fromkeys(r["params"] for r in rows):
        here = {r["method"]: r for r in rows if r["params"] == params}
        present = [m for m in BASELINES if m in here]
        if "memtrain" not in here or not present:
            continue
        best = max(present, key=lambda m: here[m]["samples_per_s"])
        runs = [mine / max(here[m]["runs_samples_per_s"][k] for m in present)
                for k, mine in enumerate(here["memtrain"]["runs_samples_per_s"])]
        out.append({"params": params, "best": best, "ratio": here["memtrain"]["samples_per_s"] /
                    here[best]["samples_per_s"], "ratio_runs": runs, "memtrain_rounds": here["memtrain"]["rounds"],
                    "memtrain_overhead_ms": here["memtrain"]["overhead_ms"]})
    return out


def bench_first_job(repeats: int, scratch: Path, progress: Reporter) -> list[dict[str, Any]]:
    """memtrain train of the README's first job against a plain loop, alternating, ``repeats`` times each."""
    data = first_job.prepare_digits(scratch)
    problem = Problem(str(data), 64, 0)
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in FIRST_JOB}
    for _ in range(repeats):
        for method in FIRST_JOB:
            progress.begin(f"the README's first command: {LABELS[method]}")
            runs[method].append(run_once(method, problem, scratch, "auto"))
    rows = []
    for method in FIRST_JOB:
        seconds = [r["seconds"] for r in runs[method]]
        rows.append({"method": method, "label": LABELS[method], "seconds": median(seconds), "runs_seconds": seconds,
                     "updates": runs[method][0]["updates"], "samples_per_s": runs[method][0]["rows"] / median(seconds),
                     "final": runs[method][0]["final"], "rounds": runs[method][0].get("rounds", []),
                     "peak_mib": max(r["peak_mib"] for r in runs[method])})
    mine = rows[0]["runs_seconds"]
    for row in rows:
        row["memtrain_ratio"] = row["seconds"] / rows[0]["seconds"]
        row["ratio_runs"] = [theirs / ours for ours, theirs in zip(mine, row["runs_seconds"], strict=True)]
    return rows


def run_once(method: str, problem: Problem, scratch: Path, exchange: str,
             data_limit: int | None = None, cluster: str = "") -> dict[str, Any]:
    """Run one method in a fresh process, sampling the memory of it and its workers from here."""
    spec = {"method": method, "problem": asdict(problem), "scratch": str(scratch / "run"), "exchange": exchange,
            "data_limit_bytes": data_limit, "cluster": cluster}
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    result, pid, peaks = run_sampled("memtrain.benchmarks.runner", spec, what=f"benchmark method {method}",
                                     timeout=RUN_TIMEOUT, env=env)
    peaks.hwm_kib[pid] = max(peaks.hwm_kib.get(pid, 0), result["self_maxrss_kib"])
    result["peak_mib"] = peaks.total_mib()
    result["pss_mib"] = peaks.pss_mib()
    result["processes"] = peaks.per_process()
    return result


def summarize(method: str, runs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Steady-state updates of every run of ``method``, pooled; medians, so that a stray slow update
    (another process on the machine, a page-cache flush) does not move the figure."""
    def steady(run: dict[str, Any], key: str) -> list[float]:
        return run[key][max(0, warmup - run.get("first_update", 0)):]

    walls = [w for r in runs for w in steady(r, "update_seconds")]
    computes = [c for r in runs for c in steady(r, "compute_seconds")]
    wall = median(walls)
    compute = median(computes) if computes else None
    rounds = runs[0].get("rounds") or []
    memtrain = method.startswith("memtrain") or method == "torch_memtrain"
    label = LABELS[method] + (f" ({placement(rounds)})" if memtrain and rounds else "")
    return {"method": method, "label": label, "samples_per_s": BATCH / wall, "update_ms": wall * 1e3,
            "compute_ms": compute * 1e3 if compute is not None else None,
            "overhead_ms": (wall - compute) * 1e3 if compute is not None else None,
            "peak_mib": max(r["peak_mib"] for r in runs), "pss_mib": max(r["pss_mib"] for r in runs),
            "updates_measured": len(walls),
            "runs_samples_per_s": [BATCH / median(steady(r, "update_seconds")) for r in runs],
            "exchange": runs[0].get("exchange"), "rounds": [r.get("rounds", []) for r in runs]}


def placement(rounds: list[str]) -> str:
    """Where memtrain's rounds ran, from its event log: "in the server" or "on N workers".

    The decision is the last line that starts with ``rounds: in the server`` or ``rounds: on N``; its
    figures may name the other place ("... 15.2 ms per update on 2 workers, 28.9 ms in the server").
    """
    decisions = [line.removeprefix("rounds: ") for line in rounds
                 if line.startswith(("rounds: in the server", "rounds: on "))]
    if not decisions:
        return "undecided"
    final = decisions[-1]
    if final.startswith("in the server"):
        return "in the server"
    return f"on {final.split()[1]} workers"


def machine() -> dict[str, Any]:
    """What the figures were measured on: they move with the CPU and the BLAS kernels far more than with memtrain."""
    import numpy as np

    return {"cpus": os.cpu_count(), "cpu": cpu_model(), "platform": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__, "blas": blas_build(),
            "torch": torch_version()}


def machine_caption(m: dict[str, Any]) -> str:
    """The line under a table that names the machine and its load (``machine()`` plus the load averages)."""
    return (f"{m['cpus']} CPUs ({m['cpu']}), numpy {m['numpy']} with {m['blas']}, Python {m['python']}; "
            f"load average {m['loadavg_before'][0]:.1f} before, {m['loadavg_after'][0]:.1f} after")


def torch_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # not installed (PackageNotFoundError), or broken metadata
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def blas_build() -> str:
    """numpy's BLAS as threadpoolctl sees it, e.g. ``openblas 0.3.31 (Haswell kernels)``."""
    from threadpoolctl import threadpool_info

    for pool in threadpool_info():
        if pool.get("user_api") == "blas":
            kernels = f" ({pool['architecture']} kernels)" if pool.get("architecture") else ""
            return f"{pool.get('internal_api', '?')} {pool.get('version', '?')}{kernels}"
    return "unknown"


def settings(args: argparse.Namespace, sizes: list[int], methods: list[str]) -> dict[str, Any]:
    return {"sizes": sizes, "methods": methods, "batch": BATCH, "workers": args.workers, "updates": args.updates,
            "warmup": args.warmup, "repeats": args.repeats, "optimizer": "sgd", "exchange": args.exchange,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "cluster": getattr(args, "cluster", "")}


def print_table(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    s = report["settings"]
    table = Table(title=f"memtrain bench train: MLP {FEATURES}-H-{CLASSES}, SGD, batch {s['batch']}, "
                        f"{s['workers']} tasks per update (peers: {s['workers']} workers); medians of "
                        f"{s['updates'] - s['warmup']} steady updates x {s['repeats']} runs per method")
    m = report["machine"]
    table.caption = machine_caption(m)
    if any(family(row["method"]) == "torch" for row in report["results"]):
        table.caption += (f"; torch {m.get('torch')}. Torch rows: the same MLP as a torch.nn.Module, ratio = "
                          "memtrain (torch module) ÷ method; DDP compute from a no_sync calibration")
    for name in ("params", "method", "samples/s", "runs ±", "ms/update", "compute ms", "overhead ms", "peak MiB",
                 "peak PSS MiB", "memtrain ÷ method", "over runs"):
        table.add_column(name, justify="left" if name == "method" else "right")
    for row in report["results"]:
        table.add_row(f"{row['params']:,}", row["label"], f"{row['samples_per_s']:,.0f}",
                      _spread(row["runs_samples_per_s"]), f"{row['update_ms']:.2f}", _num(row["compute_ms"], 2),
                      _num(row["overhead_ms"], 2), f"{row['peak_mib']:,.0f}", f"{row['pss_mib']:,.0f}",
                      _num(row["memtrain_ratio"], 2), _range(row["ratio_runs"]))
    console = Console(width=180)
    console.print(table)
    for best in report["baselines"]:
        console.print(f"{best['params']:>12,} params: memtrain ({placement(best['memtrain_rounds'][0])}) ÷ best "
                      f"of one process / all-core BLAS / shared_memory ({LABELS[best['best']]}) = "
                      f"{best['ratio']:.2f}, runs {_range(best['ratio_runs'])}; memtrain's overhead "
                      f"{_num(best['memtrain_overhead_ms'], 2)} ms per update", highlight=False)
    if report["first_job"]:
        print_first_job(report["first_job"], console)


def print_first_job(rows: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    table = Table(title="the README's first command: digits MLP 64-64-10, batch 128, Adam, 30 epochs "
                        f"({rows[0]['updates']} updates), training time")
    for name in ("method", "seconds", "runs ±", "samples/s", "val_accuracy", "peak MiB", "memtrain ÷ method",
                 "over runs"):
        table.add_column(name, justify="left" if name == "method" else "right")
    for row in rows:
        label = row["label"] + (f" ({placement(row['rounds'])})" if row["rounds"] else "")
        table.add_row(label, f"{row['seconds']:.3f}", _spread(row["runs_seconds"]), f"{row['samples_per_s']:,.0f}",
                      f"{row['final'].get('val_accuracy', float('nan')):.4f}", f"{row['peak_mib']:,.0f}",
                      f"{row['memtrain_ratio']:.2f}", _range(row["ratio_runs"]))
    console.print(table)


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _spread(values: list[float]) -> str:
    """Half the range over the runs, in percent of the median."""
    if len(values) < 2:
        return "-"
    return f"{50 * (max(values) - min(values)) / median(values):.0f}%"


def _range(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if values else "-"
