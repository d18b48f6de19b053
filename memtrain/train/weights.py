"""Flat parameter vectors -> published weight versions ``weights/vNNNNNNNN.npy``; never modified once published.

The next version is built in a temporary file that the slice owners write into; publishing is the rename.
Old versions are deleted (never rewritten) once nothing can still be reading them.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import numpy as np

from memtrain.faults import fault_point
from memtrain.files import checksum_file, is_no_space, no_space_error, npy_header_bytes, publish_array, reserve
from memtrain.layout import tmp_sibling, weight_versions, weights_path
from memtrain.models.params import PARAM_DTYPE


def publish_weights(run_dir: Path, version: int, flat: np.ndarray) -> str:
    """Publish ``flat`` as ``version``; returns its checksum."""
    path = weights_path(run_dir, version)
    publish_array(path, np.asarray(flat, dtype=PARAM_DTYPE), durable=False)
    return checksum_file(path)


def begin_weights(run_dir: Path, version: int, size: int) -> Path:
    """Create the (unpublished) file of ``version`` with its header and reserved space; returns its tmp path."""
    tmp = tmp_sibling(weights_path(run_dir, version))
    header = npy_header_bytes((size,), PARAM_DTYPE)
    total = len(header) + size * PARAM_DTYPE.itemsize
    try:
        with open(tmp, "wb") as handle:
            reserve(handle.fileno(), total, tmp)
            fault_point("write")
            handle.write(header)
            handle.truncate(total)
    except OSError as exc:
        discard(tmp)
        if is_no_space(exc):
            raise no_space_error(tmp, total) from exc
        raise
    return tmp


def commit_weights(tmp: Path, run_dir: Path, version: int) -> str:
    path = weights_path(run_dir, version)
    os.replace(tmp, path)
    return checksum_file(path)


def discard(tmp: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)


def retire_weights(run_dir: Path, keep: int, current: int) -> None:
    """Delete versions older than the newest ``keep`` (the current one is always kept)."""
    for version in weight_versions(run_dir):
        if version <= current - keep:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(weights_path(run_dir, version))
