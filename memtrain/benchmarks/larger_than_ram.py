"""A memory limit -> memtrain trained on a dataset several times larger, under that limit -> peak memory per process.

The limit is ``RLIMIT_DATA`` on the server and (inherited) on every worker: it caps private, anonymous
memory (heap, numpy arrays, BLAS buffers), which is what a process cannot give back; the dataset and
weight files are shared file maps, paged in and dropped by the kernel as needed, and do not count. A
run that needed to hold the data in its own memory would fail with MemoryError; the report shows the
largest anonymous resident size each process reached, sampled from /proc.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from memtrain.benchmarks.problem import BATCH, Problem
from memtrain.benchmarks.synthetic import FEATURES, mlp_shape, write_dataset

ROW_BYTES = FEATURES * 4 + 8  # float32 features + int64 label


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--larger-than-ram", action="store_true",
                        help="instead: train on a dataset several times larger than a memory limit")
    parser.add_argument("--limit-mib", type=int, default=256, help="private memory per process (default %(default)s)")
    parser.add_argument("--data-factor", type=float, default=4.0,
                        help="dataset size / limit (default %(default)s)")
    parser.add_argument("--params", default="1e6", help="model size for this scenario (default %(default)s)")


def run_scenario(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    from memtrain.benchmarks.train_bench import run_once

    limit = args.limit_mib << 20
    rows = int(limit * args.data_factor // ROW_BYTES) // BATCH * BATCH
    shape = mlp_shape(int(float(args.params)))
    data = write_dataset(scratch / "big", rows, BATCH, features=shape.features, classes=shape.classes)
    problem = Problem(str(data), shape.hidden, rows // BATCH, workers=args.workers,
                      shuffle=getattr(args, "shuffle", "batches"))
    result = run_once("memtrain", problem, scratch, args.exchange, data_limit=limit)
    walls = sorted(result["update_seconds"])
    anon = {p["pid"]: p["peak_anon_mib"] for p in result["processes"]}
    return {"dataset_mib": dataset_mib(data), "limit_mib": args.limit_mib, "params": shape.params,
            "updates": len(result["update_seconds"]) + 1, "samples_per_s": BATCH / walls[len(walls) // 2],
            "processes": result["processes"], "within_limit": max(anon.values()) < args.limit_mib}


def dataset_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*.npy")) / 2**20


def print_report(report: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"larger than RAM: {report['dataset_mib']:,.0f} MiB dataset, RLIMIT_DATA {report['limit_mib']} MiB per "
          f"process, {report['params']:,} parameters, {report['updates']} updates, "
          f"{report['samples_per_s']:,.0f} samples/s")
    for proc in report["processes"]:
        print(f"  pid {proc['pid']:>7} {proc['name']:<16} peak anonymous {proc['peak_anon_mib']:7.1f} MiB   "
              f"peak resident (incl. mapped files) {proc['peak_rss_mib']:7.1f} MiB")
    print("every process stayed under the limit" if report["within_limit"] else "LIMIT EXCEEDED", flush=True)
