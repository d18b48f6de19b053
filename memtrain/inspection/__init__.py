"""Datasets, runs, checkpoints, weight versions, gradients and .npy files on disk -> tables or JSON.

Reads only published files, takes no lock (safe on a run that is still training), never unpickles, and
streams statistics over memory maps (a checkpoint larger than memory is fine).

Examples (on what the README's first command makes: data/digits and runs/digits-mlp):
  memtrain inspect data/digits                       # rows, splits, shards, classes, feature statistics
  memtrain inspect runs/digits-mlp                   # job, checkpoints and weight versions
  memtrain inspect runs/digits-mlp/checkpoints/c00000390    # per-parameter statistics, optimizer state
  memtrain inspect runs/digits-mlp/weights/v00000390.npy    # one weight version
  memtrain inspect runs/digits-mlp --verify          # re-hash every file against its recorded checksum
  memtrain inspect runs/digits-mlp/checkpoints/c00000260 --diff runs/digits-mlp/checkpoints/c00000390
  memtrain inspect runs/digits-mlp --plot loss.png   # loss and accuracy curves
  memtrain inspect runs/digits-mlp --export params.npz      # the best epoch's checkpoint as named arrays
  memtrain inspect runs/digits-mlp --export params.safetensors  # (a torch model's: state_dict keys)
  memtrain inspect runs/digits-mlp --lineage 12      # version 12: the versions its gradients came from
  memtrain inspect runs/digits-mlp --json            # any view as JSON, for scripts
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from memtrain.errors import InputError, MemtrainError
from memtrain.inspection.dataset_view import dataset_view
from memtrain.inspection.detect import Target, detect
from memtrain.inspection.diff import diff_view
from memtrain.inspection.export import export
from memtrain.inspection.lineage_view import lineage_view
from memtrain.inspection.output import print_json
from memtrain.inspection.plot import plot_run
from memtrain.inspection.render import render
from memtrain.inspection.run_view import run_view
from memtrain.inspection.stats import CHUNK
from memtrain.inspection.tensor_view import tensor_view
from memtrain.inspection.tensors import Tensors, source_tensors, training_data
from memtrain.inspection.verify import Check, annotate, verify
from memtrain.train.records.checkpoint import WHICH

__all__ = ["add_arguments", "run", "detect", "build_view"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("path", type=Path, help="a dataset, run or checkpoint directory, or a .npy file")
    parser.add_argument("--all", action="store_true", help="show every feature of a dataset (default: the first 10)")
    parser.add_argument("--verify", action="store_true",
                        help="re-hash every file against its recorded checksum; exit 1 naming each bad file")
    parser.add_argument("--with-dataset", action="store_true",
                        help="with --verify on a run: also re-hash the shards of the run's dataset")
    actions = parser.add_mutually_exclusive_group()
    actions.add_argument("--diff", type=Path, metavar="OTHER",
                         help="per-parameter differences from PATH to OTHER (checkpoints, runs or versions)")
    actions.add_argument("--plot", type=Path, metavar="OUT.png", help="loss/accuracy curves of a run (matplotlib)")
    actions.add_argument("--export", type=Path, metavar="OUT.npz|OUT.h5|OUT.safetensors",
                         help="a checkpoint's (or a run's best epoch's checkpoint's, see --which) parameters as "
                              "named arrays, with the feature normalization")
    actions.add_argument("--lineage", type=int, metavar="VERSION",
                         help="where a weight version of a run came from: its gradients in the order they were "
                              "added, the version each was computed at, and the later versions that used it")
    parser.add_argument("--which", choices=WHICH, help="with --export of a run: the best epoch's checkpoint (by "
                        "train.monitor; of a reinforcement-learning run, the best greedy evaluation's) or the newest "
                        "(default: the best's if kept, else the newest)")
    parser.add_argument("--overwrite", action="store_true", help="with --export: replace an existing OUT")
    parser.add_argument("--json", action="store_true", help="print the view as JSON on stdout (NaN/Inf as null)")
    parser.add_argument("--chunk", type=int, default=CHUNK, metavar="N",
                        help=f"elements per streamed piece when computing statistics (default {CHUNK:,})")


def run(args: argparse.Namespace) -> int:
    if args.chunk < 1:
        raise InputError("--chunk must be at least 1", found=args.chunk)
    if args.with_dataset and not args.verify:
        raise InputError("--with-dataset only makes sense with --verify")
    if args.overwrite and args.export is None:
        raise InputError("--overwrite only makes sense with --export")
    if args.which is not None and args.export is None:
        raise InputError("--which only makes sense with --export", hint="load_model(run, which=...) in Python")
    target = detect(args.path)
    rl_run = _rl_run(target)
    if rl_run is not None and args.lineage is not None:  # a reinforcement-learning run (memtrain/rl/inspect.py)
        from memtrain.rl.inspect import rl_lineage_view

        emit(rl_lineage_view(rl_run, args.lineage), args.json)
        return 0
    if args.lineage is not None:
        if target.run is None:
            raise InputError("--lineage needs a run directory (or a file inside one)", path=target.path)
        emit(lineage_view(target.run, args.lineage), args.json)
        return 0
    if args.diff is not None or args.export is not None or args.plot is not None:
        return run_action(target, args)
    if rl_run is not None:  # a reinforcement-learning run, one of its checkpoints or files (memtrain/rl/inspect.py)
        from memtrain.rl.inspect import rl_checks

        checks = rl_checks(target) if args.verify else None
    else:
        checks = verify(target, dataset=args.with_dataset) if args.verify else None
    try:
        view = build_view(target, every_feature=args.all, chunk=args.chunk)
    except MemtrainError:
        report(checks or [])
        raise
    if checks is not None:
        annotate(view, checks)
    emit(view, args.json)
    return report(checks or [])


def _rl_run(target: Target) -> Path | None:
    """The reinforcement-learning run ``target`` belongs to, if it belongs to one."""
    from memtrain.rl.kind import is_rl_run

    return target.run if target.run is not None and is_rl_run(target.run) else None


def build_view(target: Target, *, every_feature: bool = False, chunk: int = CHUNK) -> dict[str, Any]:
    """The plain-dict view of ``target`` (what ``--json`` prints)."""
    if target.kind == "dataset":
        return dataset_view(target.path, every_feature=every_feature, chunk=chunk)
    if _rl_run(target) is not None and target.kind in ("run", "checkpoint"):  # memtrain/rl/inspect.py
        from memtrain.rl.inspect import rl_checkpoint_view, rl_run_view

        return rl_run_view(target.path) if target.kind == "run" else rl_checkpoint_view(target.path)
    if _rl_run(target) is not None and target.kind == "npy":  # a file of an RL checkpoint: a plain .npy
        return tensor_view(dataclasses.replace(target, run=None, checkpoint=None), chunk)
    if target.kind == "run":
        return run_view(target.path)
    return tensor_view(target, chunk)


def run_action(target: Target, args: argparse.Namespace) -> int:
    """--diff, --plot or --export (with --verify: only once every input's checksums hold)."""
    other = detect(args.diff) if args.diff is not None else None
    if args.verify:
        checks = [c for t in (target, other) if t is not None for c in verify(t, dataset=args.with_dataset)]
        if report(checks):
            return 1
    if other is not None:
        left, right = tensors_of(target)[0], tensors_of(other)[0]
        view = diff_view(left, right, args.chunk)
        left.check_unchanged()
        right.check_unchanged()
    elif args.plot is not None:
        if target.run is None:
            raise InputError("--plot needs a run directory (or a checkpoint or weight version inside one)",
                             path=target.path)
        view = plot_run(target.run, args.plot)
    else:
        tensors, meta = tensors_of(target, which=args.which)
        data = {"normalize": False} if _rl_run(target) is not None else training_data(target, meta)
        view = export(tensors, args.export, meta, args.chunk, data=data, overwrite=args.overwrite)
        tensors.check_unchanged()
    emit(view, args.json)
    return 0


def tensors_of(target: Target, which: str | None = "last") -> tuple[Tensors, dict[str, Any] | None]:
    """What --diff and --export read: ``tensors.source_tensors``, or of a reinforcement-learning run, checkpoint or
    checkpoint file ``rl.inspect.rl_source_tensors`` (its weights named by the run's params.json; the best
    evaluation's checkpoint for ``which``). A weight version of either kind of run: the same code."""
    if _rl_run(target) is not None and target.kind in ("run", "checkpoint", "npy"):
        from memtrain.rl.inspect import rl_source_tensors

        return rl_source_tensors(target, which)
    return source_tensors(target, which)


def emit(view: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(view)
    else:
        render(view)


def report(checks: list[Check]) -> int:
    """Name every failed check on stderr; 1 if there was one, else 0."""
    failures = [c for c in checks if c.failed]
    for check in failures:
        print(f"memtrain inspect: error: {check.message()}", file=sys.stderr)
    return 1 if failures else 0
