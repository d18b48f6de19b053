"""A memory limit -> memtrain trained on a dataset several times larger, under that limit -> peak memory per process.

The limit is ``RLIMIT_DATA`` on the server and (inherited) on every worker: it caps private, anonymous
memory (heap, numpy arrays, BLAS buffers), which is what a process cannot give back; the dataset and
weight files are shared file maps, paged in and dropped by the kernel as needed, and do not count. A
run that needed to hold the data in its own memory would fail with MemoryError; the report shows the
largest anonymous resident size each process reached, sampled from /proc. With ``--shuffle rows,batches``
the orders run side by side (interleaved, ``--repeats`` times), with the update time of one over the other.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from memtrain.benchmarks.problem import BATCH, Problem
from memtrain.benchmarks.synthetic import FEATURES, mlp_shape, write_dataset

ROW_BYTES = FEATURES * 4 + 8  # float32 features + int64 label


def add_arguments(parser: argparse._ActionsContainer, *, params: bool = True) -> None:
    """--larger-than-ram and its sizes; ``params``: --params too (bench train's model; bench loader has none)."""
    parser.add_argument("--larger-than-ram", action="store_true",
                        help="instead: run on a dataset several times larger than a memory limit")
    parser.add_argument("--limit-mib", type=int, default=256, help="private memory per process (default %(default)s)")
    parser.add_argument("--data-factor", type=float, default=4.0,
                        help="dataset size / limit (default %(default)s)")
    if params:
        parser.add_argument("--params", default="1e6", help="model size for this scenario (default %(default)s)")


def run_scenario(args: argparse.Namespace, scratch: Path, shuffles: list[str] = ("batches",)) -> dict[str, Any]:
    """memtrain on the big dataset under the limit, once per order of ``shuffles`` (``--shuffle``), interleaved
    ``--repeats`` times: each order's samples/s (the median update of each run; median and range over the
    runs), the update time of each order over the batches order's (repeat by repeat; train_bench.order_ratio),
    and the peak anonymous memory of every process."""
    from memtrain.benchmarks.compare import Spread, interleaved, median, pairwise
    from memtrain.benchmarks.train_bench import order_ratio, order_reference, ordered, run_once

    limit = args.limit_mib << 20
    rows = int(limit * args.data_factor // ROW_BYTES) // BATCH * BATCH
    shape = mlp_shape(int(float(args.params)))
    data = write_dataset(scratch / "big", rows, BATCH, features=shape.features, classes=shape.classes)
    os.sync()  # its pages written back now, not during the first timed run
    problem = Problem(str(data), shape.hidden, rows // BATCH, workers=args.workers)
    methods = {ordered("memtrain", shuffle, list(shuffles)): shuffle for shuffle in shuffles}

    def run(method: str, _: int) -> dict[str, Any]:
        return run_once(method, replace(problem, shuffle=methods[method]), scratch, args.exchange, data_limit=limit)

    runs = interleaved(list(methods), getattr(args, "repeats", 1), run)
    orders = []
    for method, shuffle in methods.items():
        speeds = [BATCH / median(result["update_seconds"]) for result in runs[method]]
        processes = [p for result in runs[method] for p in result["processes"]]
        orders.append({"shuffle": shuffle, "method": method, "samples_per_s": Spread.of(speeds).as_dict(),
                       "updates": len(runs[method][0]["update_seconds"]) + 1, "processes": processes,
                       "peak_anon_mib": max(p["peak_anon_mib"] for p in processes),
                       "within_limit": max(p["peak_anon_mib"] for p in processes) < args.limit_mib})
    reference = next(order for order in orders if order["shuffle"] == order_reference(list(shuffles)))
    for order in orders:
        if order is not reference:
            ratio = pairwise(reference["samples_per_s"]["runs"], order["samples_per_s"]["runs"])  # time ratio
            order.update(order_ratio("larger than RAM", order["shuffle"], reference["shuffle"], ratio))
    return {"dataset_mib": dataset_mib(data), "limit_mib": args.limit_mib, "params": shape.params,
            "orders": orders, "within_limit": all(order["within_limit"] for order in orders)}


def dataset_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*.npy")) / 2**20


PROCESS_COLUMNS = ("pid", "process", "peak anonymous MiB", "peak resident MiB (incl. mapped files)")


def print_report(report: dict[str, Any], as_json: bool) -> None:
    """The report, as JSON or for people: per order its rate and a table of its processes' peaks (split to fit
    a narrow terminal: render.print_table), the verdicts, whether every process stayed under the limit."""
    from rich.text import Text

    from memtrain.benchmarks.compare import Spread
    from memtrain.inspection.render import make_console, table
    from memtrain.inspection.render import print_table as print_grid

    if as_json:
        print(json.dumps(report, indent=2))
        return
    console = make_console()
    console.print(Text(f"larger than RAM: {report['dataset_mib']:,.0f} MiB dataset, RLIMIT_DATA "
                       f"{report['limit_mib']} MiB per process, {report['params']:,} parameters"))
    for order in report["orders"]:
        speed = Spread.of(order["samples_per_s"]["runs"]).text(0)
        peaks: dict[tuple[int, str], dict[str, Any]] = {}
        for proc in order["processes"]:
            peaks.setdefault((proc["pid"], proc["name"]), proc)
        rows = [(str(p["pid"]), p["name"], f"{p['peak_anon_mib']:.1f}", f"{p['peak_rss_mib']:.1f}")
                for p in peaks.values()]
        print_grid(console, table(f"train.shuffle = {order['shuffle']}: {order['updates']} updates, {speed} "
                                  f"samples/s (median update of each run; median and range of "
                                  f"{len(order['samples_per_s']['runs'])} runs)", PROCESS_COLUMNS, rows,
                                  right=("pid", *PROCESS_COLUMNS[2:]), keys=2))
    for order in report["orders"]:
        if "verdict" in order:
            console.print(Text(order["verdict"]))
    console.print(Text("every process stayed under the limit" if report["within_limit"] else "LIMIT EXCEEDED"))
