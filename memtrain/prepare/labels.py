"""Raw label values (text or numbers, chunk by chunk) -> the task, sorted class names and final y codes.

While reading, every label becomes a float64 *code*: text labels get a provisional id in order of first
appearance, numbers keep their value. Once the whole source has been read, ``finish`` decides the task
and maps codes to the final y: int64 class indices (classes sorted: text by string order, numbers
numerically) or float32 regression targets.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memtrain.errors import InputError

TASKS = ("auto", "classification", "regression")
# Inference rule: integer-valued numeric labels with at most this many distinct values are classes;
# anything else numeric is a regression target. Explicit --task classification allows up to MAX_CLASSES.
AUTO_MAX_CLASSES = 1000
MAX_CLASSES = 65536
# Inferred classes that look like counts (whole numbers >= 0, more than this many distinct values: visits to a
# doctor in statsmodels' randhie give 59) are still classes, as before, but prepare warns on stderr.
COUNT_LIKE_CLASSES = 20


@dataclass(frozen=True)
class Labels:
    """What ``finish`` decided: the task, class names and how to turn codes into stored y values."""

    task: str
    classes: list[str] | None
    note: str
    table: np.ndarray | None  # text: provisional id -> class index; numbers: sorted distinct values
    warning: str | None = None  # said on stderr: an inference the user should check

    @property
    def y_dtype(self) -> np.dtype:
        return np.dtype(np.int64 if self.task == "classification" else np.float32)

    def encode(self, codes: np.ndarray, *, text: bool) -> np.ndarray:
        """Float64 codes from the spool -> stored y (int64 class indices or float32 targets)."""
        if self.task == "regression":
            return codes.astype(np.float32)
        assert self.table is not None
        if text:
            return self.table[codes.astype(np.int64)]
        return np.searchsorted(self.table, codes).astype(np.int64)


class LabelCoder:
    """Turns raw label arrays into float64 codes and remembers what it saw."""

    def __init__(self, task: str, path: Path | None, column: str):
        self.task = task
        self.path = path
        self.column = column
        self.text: bool | None = None
        self._ids: dict[str, int] = {}
        self._values = np.empty(0, dtype=np.float64)
        self._many = False
        self._integral = True

    def encode(self, y: np.ndarray, where: str) -> np.ndarray:
        """One chunk of raw labels -> float64 codes (finiteness is checked by the caller)."""
        text = y.dtype.kind in "USO"
        if self.text is None:
            self._start(text, where)
        elif text != self.text:
            kind = "text" if text else "numbers"
            raise InputError("the label column mixes numbers and text", path=self.path,
                             where=f"{where}, column '{self.column}'",
                             expected="text" if self.text else "numbers", found=kind,
                             hint="the kind of label is fixed by the first rows")
        return self._text_codes(y) if text else self._number_codes(y)

    def _start(self, text: bool, where: str) -> None:
        if text and self.task == "regression":
            raise InputError("regression needs numeric targets, the label column holds text", path=self.path,
                             where=f"{where}, column '{self.column}'")
        self.text = text

    def _text_codes(self, y: np.ndarray) -> np.ndarray:
        names, inverse = np.unique(np.char.strip(y.astype(str)), return_inverse=True)
        ids = np.array([self._ids.setdefault(str(name), len(self._ids)) for name in names], dtype=np.float64)
        if len(self._ids) > MAX_CLASSES:
            raise InputError("too many distinct text labels", path=self.path, where=f"column '{self.column}'",
                             expected=f"at most {MAX_CLASSES} classes", found=f"more than {MAX_CLASSES}")
        return ids[inverse.reshape(-1)]

    def _number_codes(self, y: np.ndarray) -> np.ndarray:
        codes = y.astype(np.float64).reshape(-1)
        if self.task != "regression":
            finite = codes[np.isfinite(codes)]
            self._integral = self._integral and bool(np.all(finite == np.round(finite)))
            if not self._many:
                self._values = np.union1d(self._values, finite)
                self._many = len(self._values) > MAX_CLASSES
        return codes

    def finish(self) -> Labels:
        """Decide the task and the class table once every label has been seen."""
        if self.text:
            names = sorted(self._ids)
            order = {name: index for index, name in enumerate(names)}
            table = np.array([order[name] for name in self._ids], dtype=np.int64)
            return Labels("classification", names, f"classification: {len(names)} classes (text labels)", table)
        if self.task == "regression":
            return Labels("regression", None, "regression (--task regression)", None)
        if self.task == "classification":
            if self._many:
                raise InputError("too many distinct label values for classification", path=self.path,
                                 where=f"column '{self.column}'", expected=f"at most {MAX_CLASSES}",
                                 found=f"more than {MAX_CLASSES}", hint="use --task regression")
            return self._numeric_classes("--task classification")
        if self._integral and not self._many and len(self._values) <= AUTO_MAX_CLASSES:
            labels = self._numeric_classes("inferred: integer labels; --task regression to override")
            count = len(self._values)
            if count > COUNT_LIKE_CLASSES and self._values.min() >= 0:
                warning = (f"the label column '{self.column}' holds {count} distinct whole numbers from "
                           f"{_number_name(self._values.min())} to {_number_name(self._values.max())}: taken as "
                           f"{count} classes; if they are counts or amounts, pass --task regression")
                return Labels(labels.task, labels.classes, f"{labels.note}; {count} classes look like counts: "
                              "--task regression if they are", labels.table, warning)
            return labels
        why = "not all integers" if not self._integral else f"more than {AUTO_MAX_CLASSES} distinct values"
        return Labels("regression", None, f"regression (inferred: labels are {why})", None)

    def _numeric_classes(self, why: str) -> Labels:
        names = [_number_name(v) for v in self._values]
        return Labels("classification", names, f"classification: {len(names)} classes ({why})", self._values)


def _number_name(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(float(value))
