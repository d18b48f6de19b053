"""Benchmarks: `bench prepare` (vs a plain numpy/pyarrow baseline), `bench train` (memtrain vs peers), `bench async`,
`bench loader` (memtrain's batches vs the usual DataLoaders), `bench rl` (PPO on CartPole: memtrain.rl vs SB3 and
CleanRL).

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
  memtrain bench rl                  # PPO to return 475 on CartPole-v1: memtrain.rl vs SB3 and CleanRL, seeds 1-3
  memtrain bench rl --env-steps 20000 --sides memtrain_0,cleanrl   # a quick run (475 is rarely reached so soon)

Every comparison interleaves its methods, repeats them (--repeats) and reports the median with the min-max
range, ratios taken pair by pair (memtrain/benchmarks/compare.py); bench train times every method as a whole
process at E and 2E epochs, so that start-up cancels on every side alike (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memtrain.errors import InputError

WHAT = {"train": "memtrain against one process, pickling and shared memory (and torch DDP), per model size",
        "prepare": "memtrain prepare against a plain numpy/pyarrow baseline, per source format",
        "async": "sync against fixed staleness and async training, without and with a straggler",
        "loader": "ds.batches and BatchDataset against np.memmap and HF datasets DataLoaders",
        "rl": "PPO on CartPole-v1 to a mean return of 475: memtrain.rl against Stable-Baselines3 and CleanRL"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One subcommand per benchmark, each with its own options only (``memtrain bench train --help``)."""
    commands = parser.add_subparsers(dest="what", metavar="WHAT", required=True, title="what to measure")
    for what, summary in WHAT.items():
        sub = commands.add_parser(what, help=summary, description=_description(what, summary),
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        sub.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                         help="show tracebacks instead of short errors")
        sub.add_argument("--dir", type=Path, help="where to put the temporary files (default: $TMPDIR)")
        sub.add_argument("--repeats", type=int, default=3,
                         help="interleaved rounds of every method; figures are the median and the range over "
                              "them (default %(default)s)")
        sub.add_argument("--json", action="store_true", help="print JSON instead of a table")
        ADD[what](sub)


def _description(what: str, summary: str) -> str:
    """The subcommand's summary and its examples from this module's docstring."""
    examples = [line for line in (__doc__ or "").splitlines() if line.strip().startswith(f"memtrain bench {what}")]
    return f"memtrain bench {what}: {summary}.\n\nExamples:\n" + "\n".join(examples)


def _prepare_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gb", type=float, default=1.0, help="size of each source in GB (1.0)")
    parser.add_argument("--sources", default="npy,csv", help="comma-separated subset of npy,npz,h5,csv "
                                                             "(default %(default)s)")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds to wait after the sync before each timed run, so that every run meets the "
                             "machine's free memory in the same state (default 0; see docs/prepare-performance.md)")


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    from memtrain.benchmarks.train_bench import add_arguments, add_run_arguments

    add_run_arguments(parser)
    add_arguments(parser)


def _async_arguments(parser: argparse.ArgumentParser) -> None:
    from memtrain.benchmarks.async_bench import add_arguments
    from memtrain.benchmarks.train_bench import add_run_arguments

    add_run_arguments(parser)
    add_arguments(parser)


def _loader_arguments(parser: argparse.ArgumentParser) -> None:
    from memtrain.benchmarks.loader_bench import add_arguments

    add_arguments(parser)


def _rl_arguments(parser: argparse.ArgumentParser) -> None:
    from memtrain.benchmarks.rl_bench import add_arguments

    add_arguments(parser)


ADD = {"train": _train_arguments, "prepare": _prepare_arguments, "async": _async_arguments,
       "loader": _loader_arguments, "rl": _rl_arguments}


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
    if args.what == "rl":
        from memtrain.benchmarks.rl_bench import run as bench_rl

        return bench_rl(args)
    if args.gb <= 0:
        raise InputError("--gb must be positive", found=args.gb)
    from memtrain.prepare.bench import bench_prepare, parse_sources, print_table

    if args.settle < 0:
        raise InputError("--settle must be zero or more seconds", found=args.settle)
    report = bench_prepare(args.gb, args.dir, sources=parse_sources(args.sources), repeats=args.repeats,
                           settle=args.settle)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0
