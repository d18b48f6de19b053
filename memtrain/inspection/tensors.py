"""A recognised target -> named read-only memmaps of its parameters (or of the one array a plain .npy holds).

A flat vector gets its names from the layout that describes it: a checkpoint's ``meta.json`` for the files
inside that checkpoint, the run's ``params.json`` for its weight versions and gradients. A file whose
size does not fit that layout (an additive model's statistics, a foreign .npy) is shown as one array.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import InputError, MemtrainError
from memtrain.files import check_npy, open_npy, open_regular, read_json, still_published
from memtrain.inspection.detect import Target
from memtrain.layout import (
    CHECKPOINT_META,
    CHECKPOINT_WEIGHTS,
    MANIFEST,
    RUN_JOB,
    RUN_PARAMS,
    checkpoint_path,
    checkpoint_updates,
)
from memtrain.models.params import ParamLayout
from memtrain.train.records.checkpoint import pick_checkpoint, read_meta


@dataclass
class Tensors:
    """Named views of one .npy file. ``named_by``: the layout file that named them (None: one plain array)."""

    path: Path
    arrays: dict[str, np.ndarray]
    named_by: Path | None
    inode: int = 0  # the file read; ``check_unchanged`` confirms a live run did not retire it meanwhile

    def check_unchanged(self) -> None:
        """Raise if a live run retired (and may have reused) the file while we were reading it."""
        if self.inode and not still_published(self.path, self.inode):
            raise MemtrainError("the file was retired by the live run while it was being read", path=self.path,
                                hint="inspect it again, or inspect a checkpoint (checkpoints are never reused)")

    def layout_signature(self) -> list[tuple[str, tuple[int, ...]]]:
        return [(name, tuple(array.shape)) for name, array in self.arrays.items()]


def plain(path: Path) -> Tensors:
    """A .npy shown as one array named after the file."""
    array, inode = _map(path)
    return Tensors(path, {path.stem: array}, None, inode)


def with_layout(path: Path, layout: ParamLayout, named_by: Path, *, strict: bool) -> Tensors:
    """Name the parts of a flat vector; ``strict``: a file that does not fit the layout is corrupt."""
    if strict:
        flat, inode = _map(path, shape=(layout.size,), dtype=layout.dtype)
        return Tensors(path, layout.views(flat), named_by, inode)
    header = check_npy(path)
    if header.shape != (layout.size,) or header.dtype != layout.dtype:
        return plain(path)
    flat, inode = _map(path)
    return Tensors(path, layout.views(flat), named_by, inode)


def _map(path: Path, shape: tuple[int, ...] | None = None, dtype: Any = None) -> tuple[np.ndarray, int]:
    """A read-only map of ``path`` and the inode it maps (for ``Tensors.check_unchanged``)."""
    with open_regular(path, what="a .npy file") as handle:
        inode = os.fstat(handle.fileno()).st_ino
        header = check_npy(path, shape=shape, dtype=dtype)
        if header.nbytes == 0:
            return open_npy(path), inode
        return np.memmap(handle, dtype=header.dtype, mode="r", offset=header.offset, shape=header.shape), inode


def run_layout(run: Path) -> ParamLayout:
    path = run / RUN_PARAMS
    return ParamLayout.from_json(read_json(path, what="parameter layout"), path=path)


def checkpoint_layout(checkpoint: Path) -> ParamLayout:
    return ParamLayout.from_json(read_meta(checkpoint)["layout"], path=checkpoint / CHECKPOINT_META)


def checkpoint_file(checkpoint: Path, name: str) -> Tensors:
    """One of a checkpoint's flat files (weights or an optimizer state vector), named by its layout."""
    return with_layout(checkpoint / name, checkpoint_layout(checkpoint), checkpoint / CHECKPOINT_META, strict=True)


def open_tensors(target: Target) -> Tensors:
    """The named arrays of a checkpoint (its weights), weight version, gradient file or .npy file."""
    if target.kind == "checkpoint":
        return checkpoint_file(target.path, CHECKPOINT_WEIGHTS)
    if target.kind == "weights" and target.run is not None:
        return with_layout(target.path, run_layout(target.run), target.run / RUN_PARAMS, strict=True)
    if target.kind == "gradient" and target.run is not None:
        return with_layout(target.path, run_layout(target.run), target.run / RUN_PARAMS, strict=False)
    if target.kind == "npy" and target.checkpoint is not None:
        return with_layout(target.path, checkpoint_layout(target.checkpoint), target.checkpoint / CHECKPOINT_META,
                           strict=False)
    if target.kind in ("weights", "gradient", "npy"):
        return plain(target.path)
    raise InputError(f"a {target.kind} has no parameters to show", path=target.path,
                     hint="give a run, checkpoint, weight version or .npy file")


def complete_problem(checkpoint: Path) -> str | None:
    """Why a committed checkpoint is not usable (unreadable meta, missing file, wrong size), or None.

    Cheap: sizes only. Checksums are re-hashed by ``--verify``.
    """
    try:
        meta = read_meta(checkpoint)
        for name, record in meta["files"].items():
            size = os.path.getsize(checkpoint / name)
            if size != record["bytes"]:
                return f"{name} has {size} bytes, meta.json records {record['bytes']}"
    except FileNotFoundError as exc:
        return f"{Path(exc.filename).name} is missing"
    except (MemtrainError, KeyError, TypeError) as exc:
        return str(exc)
    return None


def newest_complete(run: Path) -> Path | None:
    """The newest checkpoint of ``run`` whose files are all present with their recorded sizes."""
    for update in reversed(checkpoint_updates(run)):
        path = checkpoint_path(run, update)
        if complete_problem(path) is None:
            return path
    return None


def training_data(target: Target, meta: dict[str, Any] | None) -> dict[str, Any] | None:
    """How the tensors' model saw its features (``normalize``, ``stats``): a checkpoint records it; for a
    weight version it is the run's job and dataset manifest. None when neither can be read."""
    if meta is not None:
        return meta.get("data")
    if target.run is None:
        return None
    try:
        job = read_json(target.run / RUN_JOB, what="saved job")
        if not job["data"]["normalize"]:
            return {"normalize": False}
        manifest = read_json(Path(job["data"]["path"]) / MANIFEST, what="dataset manifest")
        return {"normalize": True, "stats": manifest.get("stats")}
    except (MemtrainError, OSError, KeyError, TypeError):
        return None


def source_tensors(target: Target, which: str | None = "last") -> tuple[Tensors, dict[str, Any] | None]:
    """What ``--diff`` and ``--export`` read: a run's checkpoint (``which``, checkpoint.pick_checkpoint: the
    newest complete one for --diff; for --export by default the best epoch's), or the target itself.

    Returns the tensors and the checkpoint metadata (None for a weight version or a plain file).
    """
    if target.kind == "dataset":
        raise InputError("a dataset has no parameters", path=target.path,
                         hint="give a run, checkpoint, weight version or .npy file")
    checkpoint = target.path if target.kind == "checkpoint" else None
    if target.kind == "run":
        checkpoint = newest_complete(target.path)
        if checkpoint is None:
            raise InputError("the run has no complete checkpoint yet", path=target.path,
                             hint="give a weight version (weights/vNNNNNNNN.npy) instead")
        checkpoint = pick_checkpoint(target.path, checkpoint, which,
                                     note=lambda text: print(f"memtrain inspect: note: {text}", file=sys.stderr))
    if checkpoint is not None:
        return checkpoint_file(checkpoint, CHECKPOINT_WEIGHTS), read_meta(checkpoint)
    return open_tensors(target), None
