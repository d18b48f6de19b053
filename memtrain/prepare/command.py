"""Turn a CSV, NPY/NPZ, HDF5 or Parquet source (or synthetic data) into a sharded dataset directory.

Examples:
  memtrain prepare data/digits.csv data/digits
  memtrain prepare table.parquet ds --label species --val-fraction 0.2 --seed 7
  memtrain prepare features.npy ds --y labels.npy --no-shuffle
  memtrain prepare store.h5 ds --x /train/images --y /train/labels
  memtrain prepare --synthetic 1000000x64 big --classes 10
  memtrain prepare penguins.csv ds --label species --drop-columns year --missing drop
An interrupted prepare, run again with the same arguments, continues from the shards it finished.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from memtrain.errors import InputError, plural
from memtrain.prepare import options as defaults
from memtrain.prepare.labels import TASKS
from memtrain.prepare.options import PrepareOptions
from memtrain.prepare.pipeline import PrepareSummary, prepare
from memtrain.prepare.table import CATEGORICAL, MAX_LEVELS, MISSING_MODES, NA_VALUES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", nargs="?", metavar="SOURCE", type=Path,
                        help="source file (CSV, NPY, NPZ, HDF5, Parquet); not given with --synthetic")
    parser.add_argument("out", metavar="OUT", type=Path, help="output dataset directory")
    parser.add_argument("--x", help="features: .npz array name or HDF5 dataset path (default x)")
    parser.add_argument("--y", help="labels: .npz array name, HDF5 dataset path (default y), or the labels "
                                    ".npy of a .npy source")
    parser.add_argument("--label", help="CSV/Parquet target column (default: label, target or y)")
    parser.add_argument("--task", choices=TASKS, default="auto",
                        help="classification or regression (default: inferred from the labels and reported)")
    parser.add_argument("--dtype", choices=defaults.DTYPES, default="float32", help="feature dtype (float32)")
    parser.add_argument("--val-fraction", type=float, default=defaults.VAL_FRACTION,
                        help=f"share of rows in the validation split ({defaults.VAL_FRACTION})")
    parser.add_argument("--test-fraction", type=float, default=0.0,
                        help="share of rows in a test split, which training never reads (default: no test split)")
    parser.add_argument("--stratify", action="store_true",
                        help="keep each class's share of rows in train, val and test (classification)")
    parser.add_argument("--seed", type=int, default=defaults.SEED, help="seed of the shuffle and the split")
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false",
                        help="keep the source order (the validation rows are still a random subset)")
    parser.add_argument("--shard-mb", type=float, default=defaults.SHARD_MB, help="size of one shard (64 MiB)")
    parser.add_argument("--chunk-mb", type=float, default=defaults.CHUNK_MB,
                        help="rows handled at once; bounds peak memory (64 MiB)")
    parser.add_argument("--drop-nonfinite", action="store_true",
                        help="drop rows with Inf (or a NaN not spelled as missing) instead of stopping")
    table = parser.add_argument_group("tables (CSV, Parquet): text columns, missing values, column choice")
    table.add_argument("--missing", choices=MISSING_MODES, default="impute",
                       help="a missing feature value: impute (numbers get the column mean, text a <missing> level; "
                            "default), drop (the row) or error (stop)")
    table.add_argument("--na-values", metavar="A,B", type=_names, default=NA_VALUES,
                       help="spellings of a missing value (default: empty, " + ", ".join(NA_VALUES[1:]) + ")")
    table.add_argument("--columns", metavar="A,B", type=_names, help="use only these feature columns")
    table.add_argument("--drop-columns", metavar="A,B", type=_names, default=(),
                       help="leave these columns out")
    table.add_argument("--categorical", metavar="A,B", type=_names, default=(),
                       help="read these columns as text (categories) even if they hold numbers")
    table.add_argument("--categorical-encoding", choices=CATEGORICAL, default="one-hot",
                       help="one-hot: a 0/1 feature per level (default); ordinal: one feature, the level's index")
    table.add_argument("--max-levels", type=int, default=MAX_LEVELS,
                       help=f"levels kept per text column, the most frequent ({MAX_LEVELS}); others go to <rare>")
    table.add_argument("--min-level-count", type=int, default=1,
                       help="a level seen fewer times goes to <rare> (1)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an existing dataset at OUT, once the new one is complete")
    parser.add_argument("--synthetic", metavar="ROWSxFEATURES", help="generate data instead of reading SOURCE")
    parser.add_argument("--classes", type=int, default=10, help="classes of --synthetic data (10)")
    parser.add_argument("--plain", action="store_true", help="plain progress lines even on a terminal")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress (the summary is still printed)")


def run(args: argparse.Namespace) -> int:
    options = options_from_args(args)
    with _sigterm_as_interrupt():
        summary = prepare(options, say=_say, force_plain=args.plain, quiet=args.quiet)
    print_summary(summary)
    return 0


def options_from_args(args: argparse.Namespace) -> PrepareOptions:
    if (args.source is None) == (args.synthetic is None):
        given = " ".join(str(p) for p in (args.source, args.out) if p is not None)
        raise InputError("give a SOURCE file and OUT, or --synthetic ROWSxFEATURES and OUT",
                         expected="SOURCE OUT" if args.synthetic is None else "--synthetic ROWSxFEATURES OUT",
                         found=(f"--synthetic {args.synthetic} " if args.synthetic else "") + given)
    return PrepareOptions(
        source=args.source, out=args.out, x=args.x, y=args.y,
        label=args.label, task=args.task, dtype=args.dtype, val_fraction=args.val_fraction, seed=args.seed,
        shuffle=args.shuffle, shard_mb=args.shard_mb, chunk_mb=args.chunk_mb, drop_nonfinite=args.drop_nonfinite,
        overwrite=args.overwrite, synthetic=args.synthetic, classes=args.classes,
        test_fraction=args.test_fraction, stratify=args.stratify, missing=args.missing,
        na_values=tuple(args.na_values), columns=args.columns, drop_columns=tuple(args.drop_columns),
        categorical=tuple(args.categorical), categorical_encoding=args.categorical_encoding,
        max_levels=args.max_levels, min_level_count=args.min_level_count)


def _names(text: str) -> tuple[str, ...]:
    """``"a,b, c"`` -> ("a", "b", "c"); ``--na-values`` keeps an empty name ("a,,b" or a trailing comma)."""
    return tuple(name.strip() for name in text.split(","))


def _say(text: str) -> None:
    print(f"memtrain prepare: {text}", file=sys.stderr, flush=True)


def print_summary(summary: PrepareSummary) -> None:
    rate = summary.bytes / 1e6 / max(summary.seconds, 1e-9)
    lines = [
        f"prepared {summary.out}",
        f"  rows     {summary.rows:,} ("
        + ", ".join(f"{name} {rows:,}" for name, rows in summary.splits.items()) + ")"
        + (f", {summary.dropped:,} non-finite rows dropped" if summary.dropped else "")
        + (f", {plural(summary.label_missing, 'row')} without a label dropped" if summary.label_missing else "")
        + (f", {plural(summary.missing_dropped, 'row')} with a missing value dropped" if summary.missing_dropped
           else ""),
        f"  task     {summary.notes[0] if summary.notes else summary.task}",
    ]
    if summary.missing:
        lines.append(f"  missing  {sum(summary.missing.values()):,} values imputed: "
                     + ", ".join(f"{name} {n:,}" for name, n in summary.missing.items()))
    if summary.encoded:
        lines.append("  text     " + "; ".join(summary.encoded))
    if summary.classes:
        shown = ", ".join(summary.classes[:12]) + (" ..." if len(summary.classes) > 12 else "")
        lines.append(f"  classes  {shown}")
    lines.append(f"  shards   {summary.shards}" + (f" ({summary.resumed_shards} reused from the interrupted run)"
                                                   if summary.resumed_shards else ""))
    shown_rate = f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"  # a small file is not "0 MB/s"
    lines.append(f"  bytes    {summary.bytes:,} in {summary.seconds:.1f} s ({shown_rate} MB/s)")
    print("\n".join(lines))


@contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops like Ctrl-C: finished shards are kept and a rerun resumes."""
    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
