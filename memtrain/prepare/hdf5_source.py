"""An HDF5 file + two dataset paths -> chunks of rows, read slice by slice (chunked/compressed included).

A dataset stored plainly (no filters; contiguous, or chunks of whole rows) is not read through HDF5:
its rows are views of the mapped file, as for a .npy source (``hdf5_layout``).

The file is opened inside the process that reads it, once to check and once per pass, never inherited
across a fork (see RELIABILITY.md 2.3).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from memtrain.errors import InputError
from memtrain.prepare.hdf5_layout import map_rows
from memtrain.prepare.sources import Chunk, _check_lengths, _check_numeric, _labels_1d

LOCK_HINT = ("another process has the file open for writing; wait for it, or if it crashed clear the flag "
             "with `h5clear -s FILE`; a reader that accepts a file in flux can open it with locking=False "
             "(HDF5_USE_FILE_LOCKING=FALSE)")


class Hdf5Source:
    format = "hdf5"

    def __init__(self, path: Path, x_name: str | None, y_name: str | None):
        self.path = path
        self.x_name = x_name or "x"
        self.y_name = y_name or "y"
        with self._open() as handle:
            x = self._dataset(handle, self.x_name, "--x")
            y = self._dataset(handle, self.y_name, "--y")
            x_shape, y_shape, x_dtype = x.shape, y.shape, x.dtype
            self._text = y.dtype.kind in "SOU"
        _check_numeric(x_dtype, path, f"dataset '{self.x_name}'")
        if len(x_shape) == 0:
            raise InputError(f"dataset '{self.x_name}' has no row axis", path=path, found="a scalar")
        _labels_1d(y_shape, path, f"dataset '{self.y_name}'")
        _check_lengths(x_shape[0], y_shape[0], f"'{self.x_name}'", f"'{self.y_name}'", path)
        self.rows = int(x_shape[0])
        self.size_bytes = path.stat().st_size
        self.feature_shape = tuple(x_shape[1:]) or (1,)
        self.feature_names = None
        self.label_name = self.y_name

    def _open(self) -> h5py.File:
        if not h5py.is_hdf5(self.path):
            with open(self.path, "rb") as handle:
                head = handle.read(8)
            raise InputError("not an HDF5 file", path=self.path, found=f"first bytes {head!r}",
                             expected="the HDF5 signature b'\\x89HDF\\r\\n\\x1a\\n'")
        try:
            return h5py.File(self.path, "r")
        except OSError as exc:
            text = str(exc)
            if "lock" in text.lower():
                raise InputError("the HDF5 file is locked", path=self.path, found=text, hint=LOCK_HINT) from exc
            raise InputError(f"cannot open the HDF5 file ({text})", path=self.path,
                             hint="the file may be truncated or damaged; `h5clear -s FILE` clears a crashed "
                                  "writer's flags") from exc

    def _dataset(self, handle: h5py.File, name: str, flag: str) -> h5py.Dataset:
        item = handle.get(name)
        if isinstance(item, h5py.Dataset):
            return item
        found = _dataset_paths(handle)
        what = "a group, not a dataset" if item is not None else "no such path"
        raise InputError(f"HDF5 path '{name}' does not name a dataset ({what})", path=self.path,
                         expected=f"{flag} one of the datasets", found=", ".join(found[:20]) or "no datasets")

    def chunks(self, rows: int) -> Iterator[Chunk]:
        with self._open() as handle:
            x_set, y_set = handle[self.x_name], handle[self.y_name]
            x = map_rows(self.path, handle, x_set) if self.rows else None
            y = map_rows(self.path, handle, y_set) if self.rows and not self._text else None
            y_read = y_set.asstr() if self._text and y_set.dtype.kind != "U" else y_set
            for lo in range(0, self.rows, rows):
                hi = min(self.rows, lo + rows)
                try:
                    xs = x.rows(lo, hi) if x is not None else x_set[lo:hi]
                    ys = y.rows(lo, hi) if y is not None else np.asarray(y_read[lo:hi])
                except (OSError, ValueError) as exc:
                    raise InputError(f"cannot read rows {lo}..{hi - 1} ({exc})", path=self.path,
                                     where=f"row {lo}", hint="the file may be truncated or damaged") from exc
                yield Chunk(xs.reshape(hi - lo, *self.feature_shape), ys.reshape(-1).astype(str) if self._text
                            else ys.reshape(-1), lo)

    def describe(self) -> dict[str, Any]:
        return {"format": "hdf5", "path": str(self.path), "x": self.x_name, "y": self.y_name,
                "bytes": self.size_bytes}


def _dataset_paths(handle: h5py.File) -> list[str]:
    found: list[str] = []
    handle.visititems(lambda name, item: found.append("/" + name) if isinstance(item, h5py.Dataset) else None)
    return found
