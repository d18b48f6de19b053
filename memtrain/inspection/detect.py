"""A path on disk -> what it is: a dataset, run or checkpoint directory, a weight version, a gradient, a .npy.

Names are recognised by asking ``memtrain.layout`` to format the numbers found in them and comparing, so
the layout module stays the one place that knows how names look.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from memtrain.errors import InputError
from memtrain.layout import (
    CHECKPOINT_META,
    CHECKPOINTS_DIR,
    MANIFEST,
    RUN_EVENTS,
    RUN_JOB,
    RUN_LINEAGE,
    RUN_METRICS,
    RUN_PARAMS,
    WEIGHTS_DIR,
    existing_hint,
    gradient_name,
    weights_path,
)

KINDS = ("dataset", "run", "checkpoint", "weights", "gradient", "npy")
RECOGNISED = ("recognised: a dataset directory (with manifest.json), a run directory (with job.json or "
              "params.json), a checkpoint directory (with meta.json), a weight version (weights/vNNNNNNNN.npy), "
              "a gradient file (g-vNNNNNNNN-tNNNNN-aNNN.npy) or any .npy file")
RUN_FILES = (RUN_JOB, RUN_PARAMS, RUN_METRICS, RUN_LINEAGE, RUN_EVENTS)


@dataclass(frozen=True)
class Target:
    """What ``inspect`` was pointed at. ``run``/``checkpoint``: the run or checkpoint it belongs to, if any."""

    kind: str
    path: Path
    run: Path | None = None
    checkpoint: Path | None = None
    version: int | None = None
    task: int | None = None
    attempt: int | None = None


def detect(path: str | Path) -> Target:
    """Recognise ``path``; raises InputError (exit 2) naming the kinds that are recognised."""
    path = Path(path)
    if not path.exists():
        raise InputError("no such file or directory", path=path, hint=existing_hint(path) or RECOGNISED)
    if path.is_dir():
        return _directory(path)
    return _file(path)


def is_run(path: Path) -> bool:
    return (path / RUN_JOB).is_file() or (path / RUN_PARAMS).is_file()


def run_of_checkpoint(path: Path) -> Path | None:
    return path.parent.parent if path.parent.name == CHECKPOINTS_DIR and is_run(path.parent.parent) else None


def _directory(path: Path) -> Target:
    if (path / MANIFEST).is_file():
        return Target("dataset", path)
    if (path / CHECKPOINT_META).is_file():
        return Target("checkpoint", path, run=run_of_checkpoint(path), checkpoint=path)
    if is_run(path):
        return Target("run", path, run=path)
    raise InputError("not a memtrain dataset, run or checkpoint directory", path=path, hint=RECOGNISED)


def _file(path: Path) -> Target:
    parent, name = path.parent, path.name
    if name == MANIFEST:
        return Target("dataset", parent)
    if name == CHECKPOINT_META:
        return Target("checkpoint", parent, run=run_of_checkpoint(parent), checkpoint=parent)
    if name in RUN_FILES and is_run(parent):
        return Target("run", parent, run=parent)
    if path.suffix != ".npy":
        raise InputError("not a file memtrain inspects", path=path, hint=RECOGNISED)
    version = parse_version_name(name)
    if version is not None:
        run = parent.parent if parent.name == WEIGHTS_DIR and is_run(parent.parent) else None
        return Target("weights", path, run=run, version=version)
    numbers = parse_gradient_name(name)
    if numbers is not None:
        run = parent.parent if is_run(parent.parent) else None
        return Target("gradient", path, run=run, version=numbers[0], task=numbers[1], attempt=numbers[2])
    checkpoint = parent if (parent / CHECKPOINT_META).is_file() else None
    run = run_of_checkpoint(parent) if checkpoint else None
    return Target("npy", path, run=run, checkpoint=checkpoint)


def _numbers(name: str) -> list[int]:
    return [int(token) for token in re.findall(r"\d+", name)]


def parse_version_name(name: str) -> int | None:
    """The version of a weight file name such as ``v00000042.npy``, or None."""
    numbers = _numbers(name)
    if len(numbers) == 1 and weights_path(Path(), numbers[0]).name == name:
        return numbers[0]
    return None


def parse_gradient_name(name: str) -> tuple[int, int, int] | None:
    """(version, task, attempt) of a gradient file name, or None."""
    numbers = _numbers(name)
    if len(numbers) == 3 and gradient_name(*numbers) == name:
        return numbers[0], numbers[1], numbers[2]
    return None
