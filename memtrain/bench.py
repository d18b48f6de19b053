"""Benchmarks: `memtrain bench prepare` measures prepare throughput against a plain numpy/pyarrow baseline.

Examples:
  memtrain bench prepare             # 1 GB NPY and CSV sources, side by side with the baseline
  memtrain bench prepare --gb 0.1    # a quick run
`memtrain bench train` (memtrain vs one process, pickling and shared memory) is not built yet.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from memtrain.errors import InputError, MemtrainError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=("train", "prepare"), help="what to measure")
    parser.add_argument("--gb", type=float, default=1.0, help="prepare: size of each source in GB (1.0)")
    parser.add_argument("--dir", type=Path, help="prepare: where to put the temporary files (default: $TMPDIR)")


def run(args: argparse.Namespace) -> int:
    if args.what == "train":
        raise MemtrainError("not built yet", hint="`memtrain bench prepare` is available")
    if args.gb <= 0:
        raise InputError("--gb must be positive", found=args.gb)
    from memtrain.prepare.bench import bench_prepare, format_table

    print(format_table(bench_prepare(args.gb, args.dir)))
    return 0
