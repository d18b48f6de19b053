"""Two sets of named arrays (checkpoints, runs, weight versions, .npy files) -> per-parameter differences.

For each parameter: ``l2_distance = ||other - base||``, ``max_abs_diff = max |other - base|`` and
``relative_change = l2_distance / ||base||`` (None when ``||base|| = 0`` and they differ), streamed in
float64 over both memmaps. The layouts (names and shapes, in order) must match.
"""

from __future__ import annotations

from typing import Any

from memtrain.errors import InputError
from memtrain.inspection.stats import CHUNK, Difference, difference
from memtrain.inspection.tensor_view import SCHEMA
from memtrain.inspection.tensors import Tensors


def check_layouts(base: Tensors, other: Tensors) -> None:
    """Raise InputError saying how the two layouts differ, if they do."""
    mine, theirs = dict(base.layout_signature()), dict(other.layout_signature())
    if base.layout_signature() == other.layout_signature():
        return
    parts = []
    if only := [n for n in mine if n not in theirs]:
        parts.append(f"only in {base.path}: {', '.join(only)}")
    if only := [n for n in theirs if n not in mine]:
        parts.append(f"only in {other.path}: {', '.join(only)}")
    shapes = [f"{n} {mine[n]} vs {theirs[n]}" for n in mine if n in theirs and mine[n] != theirs[n]]
    if shapes:
        parts.append("shapes differ: " + ", ".join(shapes))
    if not parts:
        parts.append("the same parameters in a different order")
    raise InputError("cannot compare: the parameter layouts differ (" + "; ".join(parts) + ")",
                     path=other.path, hint="--diff compares checkpoints or versions of the same model")


def diff_view(base: Tensors, other: Tensors, chunk: int = CHUNK) -> dict[str, Any]:
    check_layouts(base, other)
    rows, total = [], Difference()
    for name, array in base.arrays.items():
        part = difference(array, other.arrays[name], chunk)
        total.merge(part)
        rows.append({"name": name, "shape": list(array.shape)} | part.to_dict())
    return {"schema": SCHEMA, "kind": "diff", "path": str(base.path), "other": str(other.path),
            "params": rows, "total": {"name": "(all)"} | total.to_dict()}
