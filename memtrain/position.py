"""A loader's position <-> its state dict, ``{"epoch": e, "batch": k, "order": {...}}``: the record of the order it
belongs to, and the check that refuses another loader's state.

A position (epoch, batch) means rows only in one order: global batch k of epoch e is other rows under another
``batch_size``, ``seed``, ``shuffle``, ``window`` or ``drop_last``, or of another dataset or split. So a state
carries ``order``, what decides those rows (the dataset's identity is its manifest's checksum, which covers
its shards' checksums, the split's rows and when it was prepared), and a loader refuses a state whose record
differs from its own, naming every difference. What does not decide rows, ``rank``, ``world`` and the
number of workers, is left out: a state resumes on any of them. A state without ``order`` (written before
it existed) is taken as it is.

>>> record = {"batch_size": 64, "seed": 0}
>>> check_state({"epoch": 1, "batch": 2, "order": {"batch_size": 64, "seed": 0}}, record)
(1, 2)
"""

from __future__ import annotations

from typing import Any

from memtrain.errors import InputError
from memtrain.files import json_checksum

KEYS = ("epoch", "batch")  # every state has them; "order" is optional (older states)
ORDER = "order"


def order_record(manifest: dict[str, Any], *, split: str, rows: int, batch_size: int, seed: int, shuffle: str,
                 window: int, drop_last: bool) -> dict[str, Any]:
    """What decides the rows of each batch, as plain JSON values (``window`` only where the order uses it)."""
    return {"dataset": json_checksum(manifest), "split": split, "rows": rows, "batch_size": batch_size,
            "seed": seed, "shuffle": shuffle, "window": window if shuffle == "rows" else None,
            "drop_last": drop_last}


def check_state(state: Any, record: dict[str, Any]) -> tuple[Any, Any]:
    """The state's (epoch, batch), unchecked (the caller checks them against its epochs); InputError when
    ``state`` is not a state, or is one of another order than ``record``."""
    if not isinstance(state, dict) or not set(KEYS) <= set(state) <= {*KEYS, ORDER}:
        raise InputError("a BatchDataset state is {'epoch': int, 'batch': int, 'order': {...}}, as state_dict() "
                         "gives it", found=repr(state))
    if ORDER in state:
        theirs = state[ORDER]
        if not isinstance(theirs, dict) or set(theirs) != set(record):
            raise InputError("the state's order record is malformed", where=ORDER, expected=sorted(record),
                             found=repr(theirs))
        differ = [key for key in record if not _same(theirs[key], record[key])]
        if differ:
            raise InputError(
                "the state belongs to another loader: its position means other rows here", where=ORDER,
                expected=", ".join(f"{key} {record[key]!r}" for key in differ),
                found=", ".join(f"{key} {theirs[key]!r}" for key in differ),
                hint="resume with a loader made as the state's was (the same dataset and split, batch_size, seed, "
                     "shuffle, window and drop_last); rank, world and the workers may differ")
    return state["epoch"], state["batch"]


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type (``True`` is not the batch size 1; a numpy array never compares as a whole)."""
    return type(a) is type(b) and a == b
