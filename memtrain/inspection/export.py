"""Named arrays (a checkpoint's parameters) -> ``OUT.npz``, ``OUT.h5`` or ``OUT.safetensors``, readable
with numpy, h5py or safetensors alone.

All are written under a temporary name and renamed into place, streaming from the memmaps (numpy
writes a zip member in 16 MiB pieces; HDF5 datasets and safetensors data are written block by block),
so a checkpoint larger than memory exports in bounded memory. An existing OUT is never replaced unless
asked (``--overwrite``). The .npz is a plain zip of ``NAME.npy`` members (never pickled:
``np.load(OUT, allow_pickle=False)`` reads it); the .h5 has one dataset per parameter and the
checkpoint's metadata as a JSON string in the file attribute ``memtrain_meta``. The .safetensors file
(https://github.com/huggingface/safetensors, format below) has one F32 tensor per parameter named by
the layout -- a torch model's state_dict keys, so ``module.load_state_dict(load_file(OUT), strict=True)``
works -- and the metadata as JSON strings.

Features are standardized in training, so the weights alone predict wrongly on raw rows. Every export
therefore carries the normalization too: ``(x - mean) / std`` per feature, float32 (std 0 already
replaced by 1), as arrays ``memtrain.normalize.mean`` and ``memtrain.normalize.std`` in .npz and .h5,
and as JSON lists under the same keys of the safetensors metadata (not as tensors, which a strict
``load_state_dict`` would refuse). A run trained without normalization exports none.

A run whose dataset was a CSV or Parquet table also carries its encoding (how raw rows become features:
column order, levels, fill values; the manifest's ``encoding``, docs/formats.md) as a JSON string under
``memtrain.encoding``: a 0-d string array in .npz (``str(np.load(OUT)["memtrain.encoding"])``), a file
attribute in .h5, a metadata entry in .safetensors.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import zipfile
from pathlib import Path
from typing import IO, Any

import numpy as np

from memtrain.errors import InputError, MemtrainError
from memtrain.files import is_no_space, no_space_error, publish, sweep_orphans
from memtrain.inspection.output import plain
from memtrain.inspection.stats import CHUNK
from memtrain.inspection.tensor_view import SCHEMA
from memtrain.inspection.tensors import Tensors
from memtrain.layout import tmp_sibling
from memtrain.models.target_scale import TargetScale, unscaled

FORMATS = {".npz": "npz", ".h5": "hdf5", ".hdf5": "hdf5", ".safetensors": "safetensors"}
NORMALIZE_KEYS = ("memtrain.normalize.mean", "memtrain.normalize.std")
ENCODING_KEY = "memtrain.encoding"
SAFETENSORS_DTYPES = {"float32": "F32", "float64": "F64", "int64": "I64", "int32": "I32", "uint8": "U8"}


def export(tensors: Tensors, out: Path, meta: dict[str, Any] | None, chunk: int = CHUNK, *,
           data: dict[str, Any] | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Write ``tensors`` (and the normalization ``data`` describes) to ``out``; returns what was written.

    ``data`` is a checkpoint's ``data`` record (``stats``, ``normalize``); None: no normalization known.
    """
    kind = FORMATS.get(out.suffix.lower())
    if kind is None:
        raise InputError("unknown export format", path=out, expected=" or ".join(FORMATS), found=out.suffix or "none")
    if out.is_dir():  # --overwrite replaces a file, never a directory: only another name helps
        raise InputError("the export path is a directory", path=out, expected="a file name ending in "
                         + " or ".join(FORMATS), hint="give a file name (e.g. inside that directory)")
    if out.exists() and not overwrite:
        raise InputError("the export file exists", path=out,
                         hint="pass --overwrite to replace the file, or give another name")
    normalize = normalization(data)
    arrays, folded = target_units(tensors.arrays, meta, data)
    encoding = json.dumps(data["encoding"], allow_nan=False) if data and data.get("encoding") else None
    clash = sorted(set(arrays) & {*NORMALIZE_KEYS, ENCODING_KEY})
    if clash:
        raise InputError("a parameter has the name the normalization is exported under", path=tensors.path,
                         found=", ".join(clash))
    sweep_orphans(out.parent, out.name.__eq__)  # what an export to the same file that was killed left
    if kind == "npz":
        text = {ENCODING_KEY: np.array(encoding)} if encoding else {}
        publish(out, lambda handle: write_npz(handle, arrays | normalize | text), durable=True)
    elif kind == "safetensors":
        extra = {key: json.dumps(value.tolist()) for key, value in normalize.items()}
        if encoding:
            extra[ENCODING_KEY] = encoding
        if meta is not None:
            extra["memtrain_meta"] = json.dumps(plain(meta), allow_nan=False)
        publish(out, lambda handle: write_safetensors(handle, arrays, extra, chunk), durable=True)
    else:
        write_h5(out, arrays | normalize, meta, chunk, encoding)
    return {"schema": SCHEMA, "kind": "export", "path": str(tensors.path), "out": str(out), "format": kind,
            "bytes": os.path.getsize(out), "normalization": "written" if normalize else
            ("none (trained on raw features)" if data is not None else "unknown (no checkpoint metadata)"),
            "encoding": "written" if encoding else "none",
            "target_scale": "folded into the output layer" if folded else "none",
            "arrays": [{"name": n, "shape": list(a.shape), "dtype": a.dtype.name} for n, a in arrays.items()]}


def target_units(arrays: dict[str, Any], meta: dict[str, Any] | None,
                 data: dict[str, Any] | None) -> tuple[dict[str, Any], bool]:
    """The arrays of a model trained on a standardized target (``data.scale_target``) with the scale folded into
    its output layer, so that the exported model predicts in the target's units; True if it was folded."""
    scale = TargetScale.from_json((data or {}).get("target_scale"))
    if scale is None or meta is None:
        return arrays, False
    return unscaled(meta["model"]["kind"], arrays, scale), True


def normalization(data: dict[str, Any] | None) -> dict[str, np.ndarray]:
    """The exported normalization arrays (mean, std with 0 -> 1), or {} when training used raw features."""
    if not data or not data.get("normalize") or not data.get("stats"):
        return {}
    std = np.asarray(data["stats"]["std"], dtype=np.float64)
    return {NORMALIZE_KEYS[0]: np.asarray(data["stats"]["mean"], dtype=np.float32),
            NORMALIZE_KEYS[1]: np.where(std > 0, std, 1.0).astype(np.float32)}


def write_safetensors(handle: IO[bytes], arrays: dict[str, np.ndarray], metadata: dict[str, str],
                      chunk: int) -> None:
    """The safetensors format: an 8-byte little-endian header length N, N bytes of JSON (padded with
    spaces to a multiple of 8) mapping each name to its dtype, shape and [begin, end) byte offsets into
    the data that follows, plus ``__metadata__`` (strings only); then the tensors' bytes, in order,
    little-endian, C order, without gaps."""
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, array in arrays.items():
        dtype = SAFETENSORS_DTYPES.get(array.dtype.name)
        if dtype is None:
            raise InputError("cannot export this dtype to safetensors", found=f"{name}: {array.dtype}",
                             expected=", ".join(SAFETENSORS_DTYPES))
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    handle.write(len(text).to_bytes(8, "little"))
    handle.write(text)
    for array in arrays.values():
        flat = array.reshape(-1)
        for lo in range(0, flat.size, chunk):
            piece = np.ascontiguousarray(flat[lo:lo + chunk], dtype=array.dtype.newbyteorder("<"))
            handle.write(memoryview(piece).cast("B"))


def write_npz(handle: IO[bytes], arrays: dict[str, np.ndarray]) -> None:
    # What np.savez does, minus its keyword arguments: a parameter named "file" would collide with them.
    with zipfile.ZipFile(handle, mode="w", compression=zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(f"{name}.npy", mode="w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(array), allow_pickle=False)


def write_h5(out: Path, arrays: dict[str, np.ndarray], meta: dict[str, Any] | None, chunk: int,
             encoding: str | None = None) -> None:
    import h5py  # a dependency, imported here so that `memtrain inspect` without --export stays light

    need = h5_bytes(arrays, meta)
    if shutil.disk_usage(out.parent).free < need:  # HDF5 on a full disk can crash the process (SIGSEGV)
        raise no_space_error(out, need)
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
            if encoding:
                handle.attrs[ENCODING_KEY] = encoding
        os.replace(tmp, out)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # h5py's errors name no file: name the target (and its filesystem's room)
            raise (no_space_error(out) if is_no_space(exc) else
                   MemtrainError(f"cannot write: {exc.strerror or exc}", path=out)) from exc
        raise


# An HDF5 file's room beyond its arrays' bytes: the superblock, root group and metadata blocks, and per
# dataset its object header and link. Measured with h5py 3 here: 18 arrays took 12 KiB beyond their data,
# 200 tiny arrays about 380 bytes each; these bounds leave several times that.
H5_FILE_OVERHEAD = 64 << 10
H5_DATASET_OVERHEAD = 4 << 10


def h5_bytes(arrays: dict[str, np.ndarray], meta: dict[str, Any] | None) -> int:
    """The room an .h5 export needs: every array's bytes, the metadata attribute, and HDF5's own overhead.

    HDF5 writing onto a full disk can crash the process (a SIGSEGV in h5py's cleanup), so the room is checked
    before anything is written."""
    meta_bytes = len(json.dumps(plain(meta), allow_nan=False)) if meta is not None else 0
    return (sum(array.nbytes for array in arrays.values()) + meta_bytes + H5_FILE_OVERHEAD
            + H5_DATASET_OVERHEAD * len(arrays))


def row_blocks(array: np.ndarray, chunk: int) -> list[tuple[int, int]]:
    """Ranges of the first axis holding about ``chunk`` elements each."""
    if array.ndim == 0 or array.shape[0] == 0:
        return []
    per_row = max(1, array.size // array.shape[0])
    step = max(1, chunk // per_row)
    return [(lo, min(lo + step, array.shape[0])) for lo in range(0, array.shape[0], step)]
