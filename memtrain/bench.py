"""Benchmarks: `bench prepare` (vs a plain numpy/pyarrow baseline), `bench train` (memtrain vs peers), `bench async`,
`bench loader` (memtrain's batches vs the usual DataLoaders).

Examples:
  memtrain bench prepare             # 1 GB NPY and CSV sources, side by side with the baseline
  memtrain bench prepare --gb 0.1    # a quick run
  memtrain bench prepare --sources npy,npz,h5,csv --repeats 3 --dir /data/scratch
  memtrain bench prepare --sources npy,h5 --settle 4   # every run after 4 s of quiet (see the docs)
  memtrain bench train               # memtrain vs one process, pickling and shared memory: 1e5-1e7 params
  memtrain bench train --sizes 1e6 --json
  memtrain bench train --larger-than-ram --limit-mib 256   # a dataset 4x larger than a memory limit
  memtrain bench train --sizes 1e6,1e7 --methods memtrain --cluster local:2   # the Dask transport vs local
  memtrain bench train --shuffle rows,batches   # train.shuffle rows and batches side by side: rows / batches
  memtrain bench train --methods memtrain --against /tmp/old   # vs another checkout (git worktree add /tmp/old C)
  memtrain bench async --against /tmp/old         # every mode also from another checkout
  memtrain bench async --sizes 1e5,1e6  # sync vs staleness 1 vs async, without and with a straggler
  memtrain bench loader              # ds.batches and BatchDataset vs np.memmap and HF datasets, 0/2/4 workers
  memtrain bench loader --larger-than-ram --limit-mib 256   # the data 4x RLIMIT_DATA of every process

Every comparison interleaves its methods, repeats them (--repeats) and reports the median with the min-max
range, ratios taken pair by pair (memtrain/benchmarks/compare.py); bench train times every method as a whole
process at E and 2E epochs, so that start-up cancels on every side alike (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memtrain.errors import InputError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("what", choices=("train", "prepare", "async", "loader"), help="what to measure")
    parser.add_argument("--gb", type=float, default=1.0, help="prepare: size of each source in GB (1.0)")
    parser.add_argument("--sources", default="npy,csv", help="prepare: comma-separated subset of npy,npz,h5,csv "
                                                              "(default %(default)s)")
    parser.add_argument("--dir", type=Path, help="where to put the temporary files (default: $TMPDIR)")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="prepare: seconds to wait after the sync before each timed run, so that every run "
                             "meets the machine's free memory in the same state (default 0; see "
                             "docs/prepare-performance.md)")
    from memtrain.benchmarks.async_bench import add_arguments as async_arguments
    from memtrain.benchmarks.loader_bench import add_arguments as loader_arguments
    from memtrain.benchmarks.train_bench import add_arguments as train_arguments

    train_arguments(parser.add_argument_group("train and async"))
    async_arguments(parser.add_argument_group("async"))
    loader_arguments(parser.add_argument_group("loader (also --methods, --repeats, --json, --larger-than-ram, "
                                               "--limit-mib, --data-factor)"))


def run(args: argparse.Namespace) -> int:
    if args.dir is not None and not args.dir.is_dir():
        raise InputError("--dir must be an existing directory", path=args.dir, expected="a directory",
                         found="a file" if args.dir.exists() else "nothing there", hint="create it first")
    if args.what == "train":
        from memtrain.benchmarks.train_bench import run as bench_train

        return bench_train(args)
    if args.what == "loader":
        from memtrain.benchmarks.loader_bench import run as bench_loader

        return bench_loader(args)
    if args.what == "async":
        from memtrain.benchmarks.async_bench import run as bench_async

        return bench_async(args)
    if args.gb <= 0:
        raise InputError("--gb must be positive", found=args.gb)
    from memtrain.prepare.bench import bench_prepare, format_table, parse_sources

    if args.settle < 0:
        raise InputError("--settle must be zero or more seconds", found=args.settle)
    report = bench_prepare(args.gb, args.dir, sources=parse_sources(args.sources), repeats=args.repeats,
                           settle=args.settle)
    print(json.dumps(report, indent=2) if args.json else format_table(report))
    return 0
