"""Parameter layout: named arrays <-> one flat float32 vector (the unit that weight files hold).

A layout may end with *buffers*: model state that is not trained by the optimizer (a torch module's
BatchNorm running statistics, frozen parameters). They ride in the same files as the parameters; the
step adds the mean of what the tasks report for them instead of applying the optimizer (train/loops/reduce.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from memtrain.errors import CorruptFileError

PARAM_DTYPE = np.dtype(np.float32)


@dataclass(frozen=True)
class ParamEntry:
    name: str
    shape: tuple[int, ...]
    offset: int
    buffer: bool = False  # not stepped by the optimizer (see the module docstring)

    @cached_property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class ParamLayout:
    """Where each named parameter lives in the flat vector.

    >>> layout = ParamLayout.from_shapes({"W": (3, 2), "b": (2,)})
    >>> layout.size, [e.offset for e in layout.entries]
    (8, [0, 6])
    """

    entries: tuple[ParamEntry, ...]
    dtype: np.dtype = PARAM_DTYPE

    @classmethod
    def from_shapes(cls, shapes: dict[str, tuple[int, ...]],
                    buffers: dict[str, tuple[int, ...]] | None = None) -> ParamLayout:
        """Parameters first, then ``buffers`` (so the trained part is one prefix of the flat vector)."""
        entries, offset = [], 0
        for is_buffer, named in ((False, shapes), (True, buffers or {})):
            for name, shape in named.items():
                entry = ParamEntry(name, tuple(int(d) for d in shape), offset, is_buffer)
                entries.append(entry)
                offset += entry.size
        return cls(tuple(entries))

    @cached_property
    def size(self) -> int:
        return sum(entry.size for entry in self.entries)

    @cached_property
    def trainable(self) -> int:
        """Length of the prefix the optimizer steps: everything before the first buffer."""
        return next((e.offset for e in self.entries if e.buffer), self.size)

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Named views into ``flat`` (no copies; writable iff ``flat`` is)."""
        return {e.name: flat[e.offset:e.offset + e.size].reshape(e.shape) for e in self.entries}

    def flatten(self, params: dict[str, np.ndarray]) -> np.ndarray:
        flat = np.empty(self.size, dtype=self.dtype)
        for name, view in self.views(flat).items():
            view[...] = params[name]
        return flat

    def to_json(self) -> dict[str, Any]:
        return {"dtype": self.dtype.str, "size": self.size,
                "params": [{"name": e.name, "shape": list(e.shape), "offset": e.offset} | ({"buffer": True}
                           if e.buffer else {}) for e in self.entries]}

    @classmethod
    def from_json(cls, data: dict[str, Any], *, path: Any = None) -> ParamLayout:
        try:
            entries = tuple(ParamEntry(p["name"], tuple(p["shape"]), int(p["offset"]), bool(p.get("buffer", False)))
                            for p in data["params"])
            layout = cls(entries, np.dtype(data["dtype"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise CorruptFileError(f"malformed parameter layout ({exc})", path=path) from exc
        if layout.size != data.get("size", layout.size):
            raise CorruptFileError("parameter layout sizes disagree", path=path,
                                   expected=data.get("size"), found=layout.size)
        return layout
