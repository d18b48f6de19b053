"""Named arrays (a checkpoint's parameters) -> ``OUT.npz`` or ``OUT.h5``, readable with numpy or h5py alone.

Both are written under a temporary name and renamed into place, streaming from the memmaps (numpy
writes a zip member in 16 MiB pieces; HDF5 datasets are filled block by block), so a checkpoint larger
than memory exports in bounded memory. The .npz is a plain zip of ``NAME.npy`` members (never pickled:
``np.load(OUT, allow_pickle=False)`` reads it); the .h5 has one dataset per parameter and the
checkpoint's metadata as a JSON string in the file attribute ``memtrain_meta``.
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np

from memtrain.errors import InputError
from memtrain.files import publish, sweep_orphans
from memtrain.inspection.output import plain
from memtrain.inspection.stats import CHUNK
from memtrain.inspection.tensor_view import SCHEMA
from memtrain.inspection.tensors import Tensors
from memtrain.layout import tmp_sibling

FORMATS = {".npz": "npz", ".h5": "hdf5", ".hdf5": "hdf5"}


def export(tensors: Tensors, out: Path, meta: dict[str, Any] | None, chunk: int = CHUNK) -> dict[str, Any]:
    """Write ``tensors`` to ``out`` (format from its suffix); returns what was written."""
    kind = FORMATS.get(out.suffix.lower())
    if kind is None:
        raise InputError("unknown export format", path=out, expected=" or ".join(FORMATS), found=out.suffix or "none")
    sweep_orphans(out.parent, out.name.__eq__)  # what an export to the same file that was killed left
    if kind == "npz":
        publish(out, lambda handle: write_npz(handle, tensors.arrays), durable=True)
    else:
        write_h5(out, tensors.arrays, meta, chunk)
    return {"schema": SCHEMA, "kind": "export", "path": str(tensors.path), "out": str(out), "format": kind,
            "bytes": os.path.getsize(out),
            "arrays": [{"name": n, "shape": list(a.shape), "dtype": a.dtype.name} for n, a in tensors.arrays.items()]}


def write_npz(handle: IO[bytes], arrays: dict[str, np.ndarray]) -> None:
    # What np.savez does, minus its keyword arguments: a parameter named "file" would collide with them.
    with zipfile.ZipFile(handle, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


def write_h5(out: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None, chunk: int) -> None:
    import h5py  # a dependency, imported here so that `memtrain inspect` without --export stays light

    tmp = tmp_sibling(out)
    try:
        with h5py.File(tmp, "w") as handle:
            for name, array in arrays.items():
                dataset = handle.create_dataset(name, shape=array.shape, dtype=array.dtype)
                for lo, hi in row_blocks(array, chunk):
                    dataset[lo:hi] = array[lo:hi]
                if array.ndim == 0:
                    dataset[()] = array
            if meta is not None:
                handle.attrs["memtrain_meta"] = json.dumps(plain(meta), allow_nan=False)
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def row_blocks(array: np.ndarray, chunk: int) -> list[tuple[int, int]]:
    """Ranges of the first axis holding about ``chunk`` elements each."""
    if array.ndim == 0 or array.shape[0] == 0:
        return []
    per_row = max(1, array.size // array.shape[0])
    step = max(1, chunk // per_row)
    return [(lo, min(lo + step, array.shape[0])) for lo in range(0, array.shape[0], step)]
