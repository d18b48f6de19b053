"""Sizes + methods -> the training benchmark tables (samples/s, overhead, peak memory, ratios), or JSON.

For each parameter count a synthetic dataset is written once. Every method runs as a user runs it, in a
fresh process timed from outside (interpreter, imports, workers, memtrain's placement trial and last
checkpoint included), twice: E epochs and 2E epochs (``--epochs``). An update's cost is the difference
over the extra updates, so whatever a run pays once cancels, on every side the same way. The methods
alternate (memtrain, one process, pickle, shared memory, BLAS on every core, then again; compare.py),
``--repeats`` times; each figure is the median of the repeats with its min-max range, and each ratio is
taken pair by pair (the runs of one repeat, made side by side), then its median and range. Per size,
memtrain against the best of the single-machine baselines, repeat by repeat. Then the README's first
command, memtrain against a plain numpy loop of the same model (memtrain/benchmarks/first_job.py): the
whole run (start-up included), and the cost of its epochs (30 against 60 epochs, start-up cancelled).

With torch installed, the same MLP as a torch module is measured too, side by side (torch_peers.py):
memtrain with ``kind = "torch"`` against torch DDP on gloo and one torch process on every core; those
rows' ratios are memtrain-torch's samples/s over theirs. Compute is the median over the longer run's
updates after ``--warmup``, as each method measured it; overhead is an update's cost less its compute.
Memory is the peak of the summed VmHWM (shared pages counted per process) and the peak of the summed PSS
(shared pages counted once) of each repeat, the median over the repeats with their range.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from memtrain.benchmarks import checkout_run, first_job, larger_than_ram
from memtrain.benchmarks.compare import Spread, Target, interleaved, median, pairwise, per_update
from memtrain.benchmarks.memory import run_sampled
from memtrain.benchmarks.memtrain_run import measured, spec_for
from memtrain.benchmarks.problem import BATCH, Problem
from memtrain.benchmarks.runner import CLUSTER_METHOD, FIRST_JOB, FORCED, METHODS, TORCH_METHODS, is_memtrain
from memtrain.benchmarks.synthetic import CLASSES, FEATURES, mlp_shape, write_dataset
from memtrain.errors import InputError
from memtrain.order import SHUFFLES
from memtrain.progress import BENCH_EVERY, Reporter, reporting

LABELS = {"memtrain": "memtrain", "one_process": "one process, 1 thread", "pickle_queue": "pickle via Queue",
          "shared_memory": "shared_memory", "one_process_blas": "one process, all-core BLAS",
          "memtrain_server": "memtrain, train.workers = 0", "memtrain_workers": "memtrain, train.workers = N",
          "first_memtrain": "memtrain train", "first_loop": "plain numpy loop",
          "torch_memtrain": "memtrain, torch module", "torch_ddp": "torch DDP, gloo",
          "torch_all_cores": "one torch process, all cores", CLUSTER_METHOD: "memtrain on Dask"}
BASES = {"memtrain": "memtrain", "torch": "torch_memtrain"}  # the row each method's ratio is taken against
# the methods that are memtrain, run once per order of --shuffle
ORDERED = ("memtrain", "memtrain_server", "memtrain_workers", "torch_memtrain", CLUSTER_METHOD)
BASELINES = ("one_process", "one_process_blas", "shared_memory")  # what a user on one machine would otherwise do
VAL_ROWS = BATCH
# Every method's validation after its last epoch against memtrain's (validation_check): the same weights up
# to float rounding, which moves a mean loss far less than this and flips a near-tie prediction or two of 512
VAL_LOSS_TOLERANCE, VAL_ACCURACY_TOLERANCE = 1e-3, 0.01
RUN_TIMEOUT = 1800.0  # seconds for one method at one size; a hung run fails the benchmark, not the machine


UPDATES, WARMUP = 40, 3  # per epoch: updates; and the first ones left out of the compute median
# bench train: a run of E epochs and one of 2E. A 1e4-parameter update takes a few ms, so 40 of them are
# less than a run's start-up varies by on a busy machine: small models run more epochs, not more rows.
EPOCHS, SMALL_EPOCHS = 1, 5
# The torch rows at up to TORCH_LONG_PARAMS (1e6): a job of that size trains for hundreds of updates, long
# enough for "auto" to start workers that each import torch (train/server/placement.py: 2 s of CPU each, measured);
# 1 and 2 epochs of 40 updates are not, so memtrain kept its rounds in the server there, as no real job
# would (docs/torch.md). Their E: the torch peers run the same epochs.
TORCH_EPOCHS, TORCH_LONG_PARAMS = 15, 2e6
FIRST_JOB_NAME = "the README's first command, memtrain / plain loop"
# issue 43: >= 0.8x the plain loop for the whole run, >= 0.6x with the start-up cancelled
FIRST_JOB_TARGETS = {"whole run, start-up included": 0.8, "start-up cancelled": 0.6}
# bench async at small sizes: an update takes a few ms there, and a rate over 37 of them (~0.1 s) swings with
# every wake-up of the machine (async's runs at 1e4 gave 0.92x and 1.36x synchronous over 20 and 180 updates)
SMALL_PARAMS, SMALL_UPDATES, SMALL_WARMUP = 2e5, 200, 20


def window(args: argparse.Namespace, *, params: int | None) -> tuple[int, int]:
    """(updates, warmup) of one run: as given, else the defaults (bench async's longer ones for a model of at
    most SMALL_PARAMS ``params``)."""
    small = params is not None and params <= SMALL_PARAMS
    return (args.updates if args.updates is not None else SMALL_UPDATES if small else UPDATES,
            args.warmup if args.warmup is not None else SMALL_WARMUP if small else WARMUP)


def epochs(args: argparse.Namespace, *, params: int, torch: bool = False) -> int:
    """E of bench train's E and 2E epochs: as given, else EPOCHS (SMALL_EPOCHS up to SMALL_PARAMS ``params``;
    TORCH_EPOCHS for the ``torch`` rows above SMALL_PARAMS and up to TORCH_LONG_PARAMS)."""
    if getattr(args, "epochs", None) is not None:
        return args.epochs
    if params <= SMALL_PARAMS:
        return SMALL_EPOCHS
    return TORCH_EPOCHS if torch and params <= TORCH_LONG_PARAMS else EPOCHS


def add_run_arguments(parser: argparse._ActionsContainer) -> None:
    """The options of one measured training job, shared by ``bench train`` and ``bench async``."""
    parser.add_argument("--sizes", default="1e4,1e5,1e6,1e7", help="parameter counts (default %(default)s)")
    parser.add_argument("--updates", type=int, help=f"updates per run (default {UPDATES}; bench async: "
                                                     f"{SMALL_UPDATES} up to {SMALL_PARAMS:.0e} parameters)")
    parser.add_argument("--warmup", type=int, help=f"updates per run left out (default {WARMUP}; bench async: "
                                                    f"{SMALL_WARMUP} up to {SMALL_PARAMS:.0e} parameters)")
    parser.add_argument("--workers", type=int, default=2,
                        help="worker processes of the peers, and tasks per update (default %(default)s)")
    parser.add_argument("--exchange", default="auto", help="memtrain's run.exchange (default %(default)s)")
    parser.add_argument("--against", metavar="PATH", action="append", default=[],
                        help="also run memtrain from another checkout (a git worktree of an older commit, e.g. "
                             "made with 'git worktree add /tmp/old COMMIT'), as the method memtrain@COMMIT, with "
                             "the same job as this checkout's memtrain[batches] (train.shuffle = batches, passed "
                             "only if that checkout knows the key); its processes import memtrain from PATH "
                             "(PYTHONPATH=PATH, checked). The update time of this checkout over PATH's is "
                             "printed per size. Repeatable; bench async: every mode also run from PATH")


def add_arguments(parser: argparse._ActionsContainer) -> None:
    """``bench train``'s own options (with ``add_run_arguments`` and bench.py's --dir, --repeats, --json)."""
    parser.add_argument("--epochs", type=int, help=f"every method runs E and 2E epochs of --updates "
                                                   f"updates; the difference is timed (default {EPOCHS}, "
                                                   f"{SMALL_EPOCHS} up to {SMALL_PARAMS:.0e} parameters; the "
                                                   f"torch rows {TORCH_EPOCHS} up to {TORCH_LONG_PARAMS:.0e})")
    parser.add_argument("--methods", help=f"comma-separated subset of {','.join(METHODS + TORCH_METHODS + FORCED)} "
                                          f"(default: {','.join(METHODS)}, and the torch ones when torch is installed)")
    parser.add_argument("--first-job", action=argparse.BooleanOptionalAction, default=True,
                        help="also time the README's first command against a plain numpy loop (default: yes)")
    add_shuffle_argument(parser)
    parser.add_argument("--cluster", metavar="ADDRESS", default="",
                        help="also run memtrain with its workers on Dask (tcp://HOST:PORT or local:N), to compare "
                             "its per-update overhead with the local exchange")
    parser.add_argument("--costs", action="store_true",
                        help="with --cluster: instead of the table, one cluster run per size, printing per update "
                             "the server's CPU and bytes read and written, each worker's bytes, and updates/s "
                             "(docs/cluster.md)")
    parser.add_argument("--startup", action="store_true",
                        help="with --cluster local:N: instead of the table, the seconds from the start of "
                             "'memtrain train' (the README's first job) to its workers listed and its first task, "
                             "--repeats runs interleaved with the same job without --cluster (docs/cluster.md)")
    larger_than_ram.add_arguments(parser)


def add_shuffle_argument(parser: argparse._ActionsContainer) -> None:
    """--shuffle: bench train's orders side by side (bench async takes it too, and runs only batches)."""
    parser.add_argument("--shuffle", default="batches",
                        help=f"memtrain's train.shuffle, one or more of {','.join(SHUFFLES)} (default %(default)s, "
                             "the order the figures in the docs were taken with). With several, every memtrain "
                             "method runs once per order in the same interleaved repeats: the first order keeps "
                             "the method's name, the others are named like memtrain[batches], and the update time "
                             "of each order over the batches order's is printed per size ('--shuffle rows,batches'"
                             ": what row shuffling costs, target <= 1.05). Also for --larger-than-ram. The peers "
                             "read contiguous batches either way")


def run(args: argparse.Namespace) -> int:
    """``memtrain bench train``: the table (or JSON); ``--larger-than-ram``: the memory-limit scenario.

    ``args.dir`` (optional) is where the temporary datasets and runs go.
    """
    sizes, methods = parse_sizes(args.sizes), parse_methods(args.methods or default_methods())
    if getattr(args, "cluster", ""):
        from memtrain.cluster.address import parse_cluster

        parse_cluster(args.cluster)
        methods.append(CLUSTER_METHOD)
    shuffles = parse_shuffles(getattr(args, "shuffle", "batches"))
    checkouts = [other_checkout(path) for path in getattr(args, "against", [])]
    if checkouts and getattr(args, "larger_than_ram", False):
        raise InputError("--against compares the table's runs; --larger-than-ram compares orders only",
                         found="both", hint="run them as two commands")
    methods = with_orders(methods, shuffles, checkouts)
    args.updates, args.warmup = window(args, params=None)
    if args.updates <= args.warmup + 1:
        raise InputError("--updates must exceed --warmup + 1", found=f"{args.updates} and {args.warmup}")
    if args.repeats < 1:
        raise InputError("--repeats must be at least 1", found=args.repeats)
    if args.epochs is not None and args.epochs < 1:
        raise InputError("--epochs must be at least 1", found=args.epochs)
    if getattr(args, "costs", False) and not getattr(args, "cluster", ""):
        raise InputError("--costs measures a cluster run", expected="--cluster ADDRESS (or local:N) too",
                         found="no --cluster")
    if getattr(args, "startup", False):
        return startup(args)
    scratch = Path(tempfile.mkdtemp(prefix="memtrain-bench-", dir=getattr(args, "dir", None)))
    try:
        if getattr(args, "costs", False):
            from memtrain.benchmarks.cluster_costs import print_costs, run_costs

            report = run_costs(sizes, args.cluster, args.updates, args.warmup, scratch)
            if args.json:
                print(json.dumps(report, indent=2))
            else:
                print_costs(report)
            return 0
        if args.larger_than_ram:
            larger_than_ram.print_report(larger_than_ram.run_scenario(args, scratch, shuffles), args.json)
            return 0
        load_before = os.getloadavg()
        first_too = args.first_job and first_job.available()
        runs = (len(sizes) * len(methods) + first_too * len(FIRST_JOB)) * args.repeats
        with reporting("bench train", runs, plain_every=BENCH_EVERY) as progress:
            rows = [row for size in sizes for row in bench_size(size, methods, args, scratch, progress,
                                                                 shuffles=shuffles, checkouts=checkouts)]
            first = bench_first_job(args.repeats, scratch, progress) if first_too else {}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report = {"machine": machine() | {"loadavg_before": load_before, "loadavg_after": os.getloadavg()},
              "settings": settings(args, sizes, methods), "results": rows, "baselines": best_of(rows),
              "orders": order_ratios(rows, shuffles), "against": against_ratios(rows, shuffles, checkouts),
              "validation": validation_check(rows, shuffles),
              "first_job": first}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def startup(args: argparse.Namespace) -> int:
    """``--startup``: the cluster start-up of the README's first job (memtrain/benchmarks/cluster_start.py)."""
    from memtrain.benchmarks import cluster_start, first_job

    if not getattr(args, "cluster", ""):
        raise InputError("--startup measures a cluster's start-up", expected="--cluster local:N too",
                         found="no --cluster")
    if not first_job.available():
        raise InputError("--startup runs the README's first job, which ships with the repository only",
                         expected=f"{first_job.JOB} and {first_job.SOURCE}", found="missing",
                         hint="run it from a clone of the repository")
    scratch = Path(tempfile.mkdtemp(prefix="memtrain-bench-", dir=getattr(args, "dir", None)))
    try:
        report = cluster_start.run_startup(args.cluster, args.repeats, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        cluster_start.print_startup(report)
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


def parse_shuffles(text: str) -> list[str]:
    """``--shuffle``: one or more train.shuffle values, comma-separated, each once."""
    shuffles = list(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [s for s in shuffles if s not in SHUFFLES]
    if unknown or not shuffles:
        raise InputError("unknown --shuffle", expected=" and/or ".join(SHUFFLES), found=", ".join(unknown) or text)
    return shuffles


def other_checkout(path: str | Path) -> Checkout:
    """``--against PATH``: a memtrain checkout (a git work tree with memtrain/ at its top), and its short commit."""
    root = Path(path).expanduser().resolve()
    if not (root / "memtrain" / "__init__.py").is_file():
        raise InputError("--against needs a memtrain checkout (a git worktree with memtrain/__init__.py)", path=root,
                         hint="make one with: git worktree add /tmp/old COMMIT")
    commit = short_commit(root)
    if commit is None:
        raise InputError("--against needs a git checkout (its commit names the method)", path=root,
                         hint="make one with: git worktree add /tmp/old COMMIT")
    if root == this_checkout().root:
        raise InputError("--against names this checkout itself", path=root, expected="another checkout")
    return Checkout(root=root, commit=commit)


def this_checkout() -> Checkout:
    """The memtrain running this benchmark, as a Checkout (its folder on PYTHONPATH runs this same code)."""
    import memtrain

    root = Path(memtrain.__file__).resolve().parent.parent
    return Checkout(root=root, commit=short_commit(root) or "this", this=True)


def short_commit(root: Path) -> str | None:
    """``git -C root rev-parse --short HEAD``; None when ``root`` is not in a git work tree."""
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=False, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


@dataclass(frozen=True, kw_only=True)
class Checkout:
    """A memtrain checkout to run: another one (``--against``), whose method is ``memtrain@commit``, or this."""

    root: Path
    commit: str
    this: bool = False

    @property
    def method(self) -> str:
        return f"memtrain@{self.commit}"


def ordered(method: str, shuffle: str, shuffles: list[str]) -> str:
    """The name of a memtrain method run with train.shuffle ``shuffle``: the first of ``--shuffle`` keeps the
    plain name, the others add it in brackets (``memtrain[batches]``)."""
    return method if shuffle == shuffles[0] else f"{method}[{shuffle}]"


def method_parts(name: str) -> tuple[str, str | None]:
    """``memtrain[batches]`` -> ("memtrain", "batches"); a plain method -> (name, None)."""
    base, _, rest = name.partition("[")
    return (base, rest.removesuffix("]")) if rest else (name, None)


def with_orders(methods: list[str], shuffles: list[str], checkouts: list[Checkout]) -> list[str]:
    """Every memtrain method once per order of ``--shuffle``; with ``--against``, memtrain[batches] (or memtrain,
    when batches is the first order) as the reference and each other checkout's memtrain after it."""
    out = []
    for method in methods:
        out += [ordered(method, s, shuffles) for s in shuffles] if method in ORDERED else [method]
    if checkouts:
        reference = ordered("memtrain", "batches", shuffles)
        if reference not in out:
            out.append(reference)
        out += [c.method for c in checkouts]
    return out


def family(method: str) -> str:
    return "torch" if method_parts(method)[0] in TORCH_METHODS else "memtrain"


def bench_size(size: int, methods: list[str], args: argparse.Namespace, scratch: Path, progress: Reporter, *,
               shuffles: list[str] = ("batches",), checkouts: list[Checkout] = ()) -> list[dict[str, Any]]:
    shape = mlp_shape(size)
    data = write_dataset(scratch / f"data-{shape.params}", args.updates * BATCH, VAL_ROWS, features=shape.features,
                         classes=shape.classes)
    problem = Problem(str(data), shape.hidden, args.updates, workers=args.workers,
                      epochs=epochs(args, params=shape.params), shuffle=shuffles[0])
    cluster = getattr(args, "cluster", "")
    others = {c.method: c for c in checkouts}

    def method_epochs(method: str) -> int:
        return epochs(args, params=shape.params, torch=family(method) == "torch")

    def run(method: str, _: int) -> dict[str, Any]:
        progress.begin(f"{shape.params:,} params: {label(method)}")
        shuffle = method_parts(method)[1]
        ordered_problem = replace(problem, shuffle=shuffle or ("batches" if method in others else shuffles[0]),
                                  epochs=method_epochs(method))
        return run_pair(method, ordered_problem, scratch, args.exchange, cluster=cluster,
                        checkout=others.get(method))

    runs = interleaved(methods, args.repeats, run)
    rows = [summarize(method, runs[method], args.warmup,
                      shuffle=shuffles[0] if len(shuffles) > 1 and method in ORDERED else None)
            | {"params": shape.params, "shape": asdict(shape),
               "epochs": [method_epochs(method), 2 * method_epochs(method)]}
            for method in methods]
    for row in rows:
        base = next((r for r in rows if r["method"] == BASES[family(row["method"])]), None)
        ratio = pairwise(base["runs_samples_per_s"], row["runs_samples_per_s"]) if base else None
        row["ratio"] = ratio.as_dict() if ratio else None
        row["memtrain_ratio"] = ratio.median if ratio else None
        row["ratio_runs"] = list(ratio.runs) if ratio else []
    return rows


def run_pair(method: str, problem: Problem, scratch: Path, exchange: str, *, cluster: str = "",
             extra: int | None = None, checkout: Checkout | None = None) -> dict[str, Any]:
    """One method at E and at 2E epochs, back to back; the seconds of one update (of ``extra`` units, default the
    E epochs' updates) from the difference. ``checkout``: memtrain of another checkout (``--against``)."""
    short = run_once(method, problem, scratch, exchange, cluster=cluster, checkout=checkout)
    long = run_once(method, replace(problem, epochs=2 * problem.epochs), scratch, exchange, cluster=cluster,
                    checkout=checkout)
    extra = extra if extra is not None else problem.updates * problem.epochs
    return {"short": short, "long": long, "extra_updates": extra,
            "update_s": per_update(short["wall_seconds"], long["wall_seconds"], extra),
            "cpu_update_s": per_update(short.get("cpu_seconds", 0.0), long.get("cpu_seconds", 0.0), extra)}


def best_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per size: memtrain against the best of the single-machine baselines, repeat by repeat."""
    out = []
    for params in dict.fromkeys(r["params"] for r in rows):
        here = {r["method"]: r for r in rows if r["params"] == params}
        present = [m for m in BASELINES if m in here]
        if "memtrain" not in here or not present:
            continue
        per_repeat = zip(*(here[m]["runs_samples_per_s"] for m in present), strict=True)
        best_runs = [None if None in speeds else max(speeds) for speeds in per_repeat]
        ratio = pairwise(here["memtrain"]["runs_samples_per_s"], best_runs)
        timed = [m for m in present if here[m]["samples_per_s"] is not None]
        fastest = max(timed, key=lambda m: here[m]["samples_per_s"]) if timed else None
        out.append({"params": params, "best": fastest,
                    "ratio": ratio.as_dict() if ratio else None, "memtrain_rounds": here["memtrain"]["rounds"],
                    "memtrain_overhead_ms": here["memtrain"]["overhead_ms"],
                    "memtrain_cpu_ms": here["memtrain"]["cpu_ms"],
                    "best_cpu_ms": here[fastest]["cpu_ms"] if fastest else None,
                    "best_update_ms": here[fastest]["update_ms"] if fastest else None})
    return out


def validation_check(rows: list[dict[str, Any]], shuffles: list[str]) -> list[dict[str, Any]]:
    """Per size and family: whether every method validated after each of its epochs (``val_passes`` of each
    run = its epochs), and whether each method's validation after its last epoch (the first repeat's longer
    run) agrees with memtrain's, which trained the same weights in the same order up to float rounding:
    val_loss within VAL_LOSS_TOLERANCE (relative), val_accuracy within VAL_ACCURACY_TOLERANCE. Orders other
    than batches are not compared (the peers read the batches order)."""
    out = []
    for params in dict.fromkeys(r["params"] for r in rows):
        here = [r for r in rows if r["params"] == params and method_parts(r["method"])[1] is None
                and "@" not in r["method"]]
        for kind in dict.fromkeys(family(r["method"]) for r in here):
            group = [r for r in here if family(r["method"]) == kind]
            base = next((r for r in group if r["method"] == BASES[kind]), None)
            every = all(passes == row["epochs"] for row in group for passes in row["val_passes"])
            compared = [] if base is None or shuffles[0] != "batches" or not base["final"] else [
                r for r in group if r is not base and r["method"] in LABELS and r["final"]]
            differ = [r["method"] for r in compared if not validation_agrees(r["final"], base["final"])]
            out.append({"params": params, "family": kind, "every_epoch": every,
                        "compared": [r["method"] for r in compared], "differ": differ,
                        "finals": {r["method"]: r["final"] for r in group},
                        "verdict": validation_verdict(group, every, compared, differ)})
    return out


def validation_agrees(mine: dict[str, float], base: dict[str, float]) -> bool:
    """The same weights' validation, up to float rounding (VAL_LOSS_TOLERANCE, VAL_ACCURACY_TOLERANCE)."""
    if "val_loss" not in mine or "val_loss" not in base:
        return False
    loss = abs(mine["val_loss"] - base["val_loss"]) <= VAL_LOSS_TOLERANCE * max(abs(base["val_loss"]), 1e-12)
    accuracy = abs(mine.get("val_accuracy", -1.0) - base.get("val_accuracy", -1.0)) <= VAL_ACCURACY_TOLERANCE
    return loss and accuracy


def validation_verdict(group: list[dict[str, Any]], every: bool, compared: list[dict[str, Any]],
                       differ: list[str]) -> str:
    figures = ", ".join(f"{label(r['method'])} {r['final']['val_loss']:.4f} / {r['final'].get('val_accuracy', 0):.4f}"
                        for r in group if "val_loss" in r["final"])
    passes = "every method validated after each epoch" if every else "NOT every run validated after each epoch"
    if not compared:
        agreement = "not compared with memtrain's"
    elif differ:
        agreement = f"DIFFERS from memtrain's: {', '.join(label(m) for m in differ)}"
    else:
        agreement = (f"agrees with memtrain's (val_loss within {VAL_LOSS_TOLERANCE:g} relative, accuracy within "
                     f"{VAL_ACCURACY_TOLERANCE:g})")
    return f"{passes}; validation after the last epoch (val_loss / accuracy: {figures}) {agreement}"


ORDER_TARGET = Target(name="update time, rows / batches order", at_most=1.05)  # issue 27: rows costs <= 5%


def order_reference(shuffles: list[str]) -> str:
    """The order the others' update times are divided by: "batches" when it is run, else the last one."""
    return "batches" if "batches" in shuffles else shuffles[-1]


def order_ratio(name: str, shuffle: str, reference: str, ratio: Spread | None) -> dict[str, Any]:
    """The update time of ``shuffle`` over ``reference``'s, with a verdict against ORDER_TARGET for rows / batches."""
    name = f"{name}: update time, {shuffle} / {reference} order"
    if ratio is None:
        verdict = f"{name}: not timed"
    elif (shuffle, reference) == ("rows", "batches"):
        verdict = replace(ORDER_TARGET, name=name).verdict(ratio)
    else:
        verdict = f"{name}: {ratio.text()}x"
    return {"name": name, "ratio": ratio.as_dict() if ratio else None, "verdict": verdict}


def order_ratios(rows: list[dict[str, Any]], shuffles: list[str]) -> list[dict[str, Any]]:
    """Per size and memtrain method run in several orders: each order's update time over the reference order's
    (order_reference), repeat by repeat (``--shuffle rows,batches``: rows / batches, the cost of row shuffling)."""
    out = []
    reference = order_reference(shuffles)
    for params in dict.fromkeys(r["params"] for r in rows):
        here = {r["method"]: r for r in rows if r["params"] == params}
        for method in [m for m in here if method_parts(m)[1] is None and "@" not in m]:
            base = here.get(ordered(method, reference, shuffles))
            for shuffle in [s for s in shuffles if s != reference]:
                row = here.get(ordered(method, shuffle, shuffles))
                if base is None or row is None:
                    continue
                ratio = pairwise(base["runs_samples_per_s"], row["runs_samples_per_s"])  # time: row / base
                out.append({"params": params, "method": method}
                           | order_ratio(LABELS.get(method, method), shuffle, reference, ratio))
    return out


def against_ratios(rows: list[dict[str, Any]], shuffles: list[str], checkouts: list[Checkout]) -> list[dict[str, Any]]:
    """Per size and other checkout: this checkout's update time over that checkout's, the same job
    (train.shuffle = batches), repeat by repeat."""
    out = []
    reference = ordered("memtrain", "batches", shuffles)
    for params in dict.fromkeys(r["params"] for r in rows):
        here = {r["method"]: r for r in rows if r["params"] == params}
        for checkout in checkouts:
            if reference not in here or checkout.method not in here:
                continue
            ratio = pairwise(here[checkout.method]["runs_samples_per_s"], here[reference]["runs_samples_per_s"])
            out.append({"params": params, "commit": checkout.commit, "root": str(checkout.root),
                        "name": f"update time, {reference} / {checkout.method} (the same job)",
                        "ratio": ratio.as_dict() if ratio else None})
    return out


def bench_first_job(repeats: int, scratch: Path, progress: Reporter) -> dict[str, Any]:
    """memtrain train of the README's first job against a plain loop, alternating, ``repeats`` times each: the
    whole run (its E epochs, start-up included) and the cost of E more epochs (start-up cancelled)."""
    data = first_job.prepare_digits(scratch)
    problem = Problem(str(data), 64, 0, epochs=first_job.epochs())

    def run(method: str, _: int) -> dict[str, Any]:
        progress.begin(f"the README's first command: {LABELS[method]}")
        return run_pair(method, problem, scratch, "auto", extra=1)

    runs = interleaved(FIRST_JOB, repeats, run)
    rows = []
    for method in FIRST_JOB:
        whole = [pair["short"]["wall_seconds"] for pair in runs[method]]
        extra = [pair["update_s"] for pair in runs[method]]  # run_pair's "update" is the run here: E more epochs
        short = runs[method][0]["short"]
        rows.append({"method": method, "label": LABELS[method], "epochs": problem.epochs,
                     "updates": short["updates"], "whole_seconds": Spread.of(whole).as_dict(), "runs_whole": whole,
                     "epochs_seconds": Spread.of([e for e in extra if e]).as_dict() if any(extra) else None,
                     "runs_epochs": extra, "final": short["final"], "rounds": short.get("rounds", []),
                     "peak_mib": max(pair[k]["peak_mib"] for pair in runs[method] for k in ("short", "long"))})
    memtrain, loop = rows
    ratios = {"whole run, start-up included": pairwise(loop["runs_whole"], memtrain["runs_whole"]),
              f"{problem.epochs} more epochs, start-up cancelled": pairwise(loop["runs_epochs"],
                                                                          memtrain["runs_epochs"])}
    return {"rows": rows, "ratios": {name: ratio.as_dict() if ratio else None for name, ratio in ratios.items()},
            "verdicts": [Target(name=f"{FIRST_JOB_NAME}, {name}", at_least=first_job_target(name))
                         .verdict(ratio) if ratio else f"{name}: not timed (E and 2E epochs too close)"
                         for name, ratio in ratios.items()]}


def first_job_target(name: str) -> float:
    """The first command's target for the ratio ``name`` (``FIRST_JOB_TARGETS``, by the end of its name)."""
    return next(at_least for end, at_least in FIRST_JOB_TARGETS.items() if name.endswith(end))


def run_once(method: str, problem: Problem, scratch: Path, exchange: str,
             data_limit: int | None = None, cluster: str = "", checkout: Checkout | None = None) -> dict[str, Any]:
    """Run one method in a fresh process, sampling the memory of it and its workers from here; ``wall_seconds``
    is that process's life, from its start to its exit, as a user's command is timed. ``checkout``: memtrain
    of another checkout, the same job as this one's with train.shuffle = "batches" (checkout_run.py)."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    started = time.perf_counter()
    if checkout is not None:
        spec = spec_for(problem, scratch / "run", exchange, workers="auto", portable=True) | {
            "data_limit_bytes": data_limit}
        raw, pid, peaks = run_checkout(checkout, spec, scratch, what=f"benchmark method {method}", env=env)
        result = measured(raw) | {"self_maxrss_kib": raw["self_maxrss_kib"], "cpu_seconds": raw["cpu_seconds"]}
    else:
        spec = {"method": method_parts(method)[0], "problem": asdict(problem), "scratch": str(scratch / "run"),
                "exchange": exchange, "data_limit_bytes": data_limit, "cluster": cluster}
        result, pid, peaks = run_sampled("memtrain.benchmarks.runner", spec, what=f"benchmark method {method}",
                                         timeout=RUN_TIMEOUT, env=env)
    result["wall_seconds"] = time.perf_counter() - started
    peaks.hwm_kib[pid] = max(peaks.hwm_kib.get(pid, 0), result["self_maxrss_kib"])
    result["peak_mib"] = peaks.total_mib()
    result["pss_mib"] = peaks.pss_mib()
    result["processes"] = peaks.per_process()
    return result


def run_checkout(checkout: Checkout, spec: dict[str, Any], scratch: Path, *, what: str, env: dict[str, str],
                 alongside: Callable[[int], Callable[[], None]] | None = None) -> tuple[dict[str, Any], int, Any]:
    """checkout_run.py (this checkout's file) as a script, importing memtrain from ``checkout``: ``-P`` keeps the
    script's folder off sys.path, PYTHONPATH puts the checkout first (for the run's workers too), and the
    working directory is the scratch folder, never a checkout. Checks the memtrain it imported."""
    env = env | {"PYTHONPATH": str(checkout.root)}
    result, pid, peaks = run_sampled("", spec, what=what, timeout=RUN_TIMEOUT, env=env, cwd=scratch,
                                     command=[sys.executable, "-P", checkout_run.__file__], alongside=alongside)
    checkout_run.check_imported(result, checkout.root, what)
    return result, pid, peaks


def label(method: str, shuffle: str | None = None) -> str:
    """A method's name in the tables: ``memtrain[batches]`` -> "memtrain, batches order" (``shuffle``: the order
    of a method named without it); another checkout's as named."""
    base, named = method_parts(method)
    order = named or shuffle
    return LABELS.get(base, base) + (f", {order} order" if order else "")


def summarize(method: str, pairs: list[dict[str, Any]], warmup: int, *, shuffle: str | None = None
              ) -> dict[str, Any]:
    """A method's repeats: its update cost (from E and 2E epochs, median and range), its compute (the median over
    the longer runs' updates after ``warmup``, as the method measured it), its peak memory and the memtrain its
    runs imported. ``shuffle``: the order of a method whose name does not say it, for its label."""
    seconds = [pair["update_s"] for pair in pairs]
    timed = [s for s in seconds if s is not None]
    computes = [c for pair in pairs
                for c in pair["long"]["compute_seconds"][max(0, warmup - pair["long"].get("first_update", 0)):]]
    wall = median(timed) if timed else None
    compute = median(computes) if computes else None
    cpus = [pair["cpu_update_s"] for pair in pairs if pair["cpu_update_s"]]
    startups = [pair["short"]["wall_seconds"] - pair["extra_updates"] * s for pair, s in zip(pairs, seconds,
                                                                                           strict=True) if s]
    places = placements(pairs) if is_memtrain(method) else []
    where = places[0] if len(places) == 1 else "placements differ"  # which: under the table
    named = label(method, shuffle) + (f" ({where})" if places else "")
    return {"method": method, "label": named,
            "samples_per_s": BATCH / wall if wall else None, "update_ms": wall * 1e3 if wall else None,
            "update_ms_range": [min(timed) * 1e3, max(timed) * 1e3] if timed else None,
            "compute_ms": compute * 1e3 if compute is not None else None,
            "overhead_ms": (wall - compute) * 1e3 if wall and compute is not None else None,
            "cpu_ms": median(cpus) * 1e3 if cpus else None,
            "startup_s": Spread.of(startups).as_dict() if startups else None,
            **memory_peaks(pairs),
            "extra_updates": pairs[0]["extra_updates"], "untimed_repeats": len(seconds) - len(timed),
            "runs_samples_per_s": [BATCH / s if s else None for s in seconds],
            "exchange": pairs[0]["long"].get("exchange"), "rounds": [pair["long"].get("rounds", []) for pair in pairs],
            "imported_from": sorted({pair[k]["memtrain_file"] for pair in pairs for k in ("short", "long")
                                     if "memtrain_file" in pair[k]}),
            "val_passes": [[pair[k].get("val_passes") for k in ("short", "long")] for pair in pairs],
            "final": pairs[0]["long"].get("final") or {}, "placements": places}


def memory_peaks(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each repeat's peak memory (the larger of its E- and 2E-epoch runs'), summed over the method's
    processes: the median over the repeats, as every other figure, and the range beside it (``*_range``)."""
    peaks = {}
    for key in ("peak_mib", "pss_mib"):
        spread = Spread.of([max(pair["short"][key], pair["long"][key]) for pair in pairs])
        peaks[key], peaks[f"{key}_range"] = spread.median, [spread.low, spread.high]
    return peaks


def placements(pairs: list[dict[str, Any]]) -> list[str]:
    """Where memtrain's rounds ran in each of its E- and 2E-epoch runs, each place once: more than one, and an
    update's cost taken from the runs' difference mixes them (``"auto"`` decided differently in the two runs
    of a pair, or in two repeats)."""
    return sorted({placement(pair[k]["rounds"]) for pair in pairs for k in ("short", "long")
                   if pair[k].get("rounds")})


def placement(rounds: list[str]) -> str:
    """Where memtrain's rounds ran, from its event log: "in the server", "in the server, N threads",
    "on 1 worker" or "on N workers".

    The decision is the last line that starts with ``rounds: in the server`` or ``rounds: on N``; its
    figures may name the other place ("... 15.2 ms per update on 2 workers, 28.9 ms in the server"). In
    the server, the last ``rounds in the server: an update's tasks on ...`` line says on how many threads
    it computed an update's tasks (train/server/placement.py).
    """
    decisions = [line.removeprefix("rounds: ") for line in rounds
                 if line.startswith(("rounds: in the server", "rounds: on "))]
    if not decisions:
        return "undecided"
    final = decisions[-1]
    if not final.startswith("in the server"):  # "on 1 worker" when auto kept an outlined model's child alone
        count = final.split()[1]
        return f"on {count} worker{'' if count == '1' else 's'}"
    threads = [line for line in rounds if line.startswith("rounds in the server: an update's tasks on ")]
    words = threads[-1].removeprefix("rounds in the server: an update's tasks on ").split() if threads else []
    return f"in the server, {words[0]} threads" if words and words[0].isdigit() else "in the server"


def machine() -> dict[str, Any]:
    """What the figures were measured on: they move with the CPU and the BLAS kernels far more than with memtrain."""
    import numpy as np

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpus": os.cpu_count(), "cpu": cpu_model(), "memory_gib": round(memory, 1),
            "platform": platform.platform(), "python": platform.python_version(), "numpy": np.__version__,
            "blas": blas_build(), "torch": torch_version()}


def machine_caption(m: dict[str, Any]) -> str:
    """The line under a table that names the machine and its load (``machine()`` plus the load averages)."""
    return (f"{m['cpus']} CPUs ({m['cpu']}), {m['memory_gib']:g} GiB RAM, numpy {m['numpy']} with {m['blas']}, "
            f"Python {m['python']}; "
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
            "epochs": {str(size): epochs(args, params=mlp_shape(size).params) for size in sizes},
            "torch_epochs": {str(size): epochs(args, params=mlp_shape(size).params, torch=True) for size in sizes},
            "warmup": args.warmup, "repeats": args.repeats, "optimizer": "sgd", "exchange": args.exchange,
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "cluster": getattr(args, "cluster", "")}


def print_table(report: dict[str, Any]) -> None:
    """The report for people, on stdout: the table (split to fit a narrow terminal: render.print_table), the
    machine, then a line per finding."""
    from rich.text import Text

    from memtrain.inspection.render import make_console, table
    from memtrain.inspection.render import print_table as print_grid

    s = report["settings"]
    title = (f"memtrain bench train: MLP {FEATURES}-H-{CLASSES}, SGD, batch {s['batch']}, {s['workers']} tasks per "
             f"update (peers: {s['workers']} workers), {s['updates']} updates per epoch; every method run E and 2E "
             "epochs (\"epochs\"), an update's cost from the difference; median (min-max) of "
             f"{s['repeats']} interleaved repeats")
    m = report["machine"]
    caption = machine_caption(m)
    if any(family(row["method"]) == "torch" for row in report["results"]):
        caption += (f"; torch {m.get('torch')}. Torch rows: the same MLP as a torch.nn.Module, ratio = "
                    "memtrain (torch module) ÷ method; DDP compute from a no_sync calibration")
    columns = ("params", "epochs", "method", "samples/s", "ms/update (range)", "compute ms", "overhead ms",
               "CPU ms/update", "start-up s", "peak MiB (range)", "peak PSS MiB (range)", "memtrain ÷ method (range)")
    rows = []
    for row in report["results"]:
        update = "-" if row["update_ms"] is None else \
            f"{row['update_ms']:.2f} ({row['update_ms_range'][0]:.2f}-{row['update_ms_range'][1]:.2f})"
        rows.append((f"{row['params']:,}", "{} & {}".format(*row["epochs"]), row["label"],
                     _num(row["samples_per_s"], 0), update, _num(row["compute_ms"], 2), _num(row["overhead_ms"], 2),
                     _num(row["cpu_ms"], 2), _spread_text(row["startup_s"]), _mib_text(row, "peak_mib"),
                     _mib_text(row, "pss_mib"), _spread_text(row["ratio"])))
    console = make_console()
    print_grid(console, table(title, columns, rows, right=set(columns) - {"method"}, keys=3))
    console.print(Text(caption))
    untimed = [row for row in report["results"] if row["untimed_repeats"]]
    for row in untimed:
        console.print(Text(f"{row['params']:,} params, {row['label']}: {row['untimed_repeats']} repeat(s) where 2E "
                           "epochs took no longer than E (start-up noise larger than the extra updates): raise "
                           "--epochs or --updates"))
    for row in report["results"]:
        if len(row["placements"]) > 1:
            console.print(Text(f"{row['params']:,} params, {row['label']}: its runs ended in different places "
                               f"({' / '.join(row['placements'])}), so its update cost mixes them: raise --epochs "
                               "until \"auto\" decides alike in every run"))
    for best in report["baselines"]:
        console.print(Text(f"{best['params']:>12,} params: memtrain ({placement(best['memtrain_rounds'][0])}) ÷ "
                           f"best of one process / all-core BLAS / shared_memory, repeat by repeat = "
                           f"{_spread_text(best['ratio'])}; memtrain's overhead "
                           f"{_num(best['memtrain_overhead_ms'], 2)} ms per update"))
        cores = report["settings"].get("cores") or 1
        if best["memtrain_cpu_ms"] and best["best_cpu_ms"] and best["best_update_ms"]:
            floor = best["memtrain_cpu_ms"] / cores
            console.print(Text(
                f"{best['params']:>12,} params: CPU per update, memtrain {best['memtrain_cpu_ms']:.2f} ms, the "
                f"fastest baseline ({LABELS.get(best['best'], best['best'])}) {best['best_cpu_ms']:.2f} ms: on "
                f"{cores} cores memtrain's update takes at least {floor:.2f} ms, so it can reach at most "
                f"{best['best_update_ms'] / floor:.2f}x that baseline's {best['best_update_ms']:.2f} ms"))
    for check in report.get("validation", []):
        console.print(Text(f"{check['params']:>12,} params, {check['family']} rows: {check['verdict']}"))
    for order in report.get("orders", []):
        console.print(Text(f"{order['params']:>12,} params: {order['verdict']}"))
    for other in report.get("against", []):
        console.print(Text(f"{other['params']:>12,} params: {other['name']} = {_spread_text(other['ratio'])} "
                           f"(above 1: this checkout is slower; {other['root']})"))
    if report["first_job"]:
        print_first_job(report["first_job"], console)


def print_first_job(first: dict[str, Any], console: Any) -> None:
    from rich.text import Text

    from memtrain.inspection.render import print_table as print_grid
    from memtrain.inspection.render import table

    rows = first["rows"]
    title = (f"the README's first command: digits MLP 64-64-10, batch 128, Adam, {rows[0]['epochs']} epochs "
             f"({rows[0]['updates']} updates); each side run {rows[0]['epochs']} and {2 * rows[0]['epochs']} "
             "epochs as a whole process")
    columns = ("method", f"{rows[0]['epochs']} epochs, whole run s", f"{rows[0]['epochs']} more epochs s",
               "val_accuracy", "peak MiB")
    cells = [(row["label"] + (f" ({placement(row['rounds'])})" if row["rounds"] else ""),
              _spread_text(row["whole_seconds"], 3), _spread_text(row["epochs_seconds"], 3),
              f"{row['final'].get('val_accuracy', float('nan')):.4f}", f"{row['peak_mib']:,.0f}") for row in rows]
    print_grid(console, table(title, columns, cells, right=columns[1:]))
    for verdict in first["verdicts"]:
        console.print(Text(verdict))


def _mib_text(row: dict[str, Any], key: str) -> str:
    """A memory peak as ``1,254 (1,208-1,274)``: the median over the repeats and their range."""
    low, high = row[f"{key}_range"]
    return f"{row[key]:,.0f}" if low == high else f"{row[key]:,.0f} ({low:,.0f}-{high:,.0f})"


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _spread_text(spread: dict[str, Any] | None, digits: int = 2) -> str:
    """A ``Spread.as_dict()`` as ``1.23 (1.10-1.40)``; "-" when nothing was timed."""
    if spread is None:
        return "-"
    return Spread.of(spread["runs"]).text(digits)
