"""A run or checkpoint directory -> a model object with ``predict`` / ``predict_proba`` on raw features.

It applies the same normalization as training (the statistics are stored in the checkpoint), and maps
class indices back to class names with ``classes``. A model trained on a CSV or Parquet table also takes raw
rows with the source's column names (a pandas DataFrame, a dict of columns, or a list of dicts such as
``csv.DictReader`` gives): the encoding prepare recorded (levels, fill values, column order) is applied first.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import InputError
from memtrain.layout import CHECKPOINT_META, CHECKPOINTS_DIR
from memtrain.models.target_scale import TargetScale
from memtrain.prepare.table import Encoding, is_raw
from memtrain.train.context import ModelContext, model_context_from_manifest
from memtrain.train.records.checkpoint import WHICH, load_checkpoint, newest_checkpoint, pick_checkpoint
from memtrain.train.records.metrics import combine, task_statistics


@dataclass
class TrainedModel:
    """A checkpoint's model, ready to predict on raw rows (normalized as in training): ``predict``,
    ``predict_proba`` (classifiers that give probabilities), ``evaluate``, and ``classes`` (class names)."""

    context: ModelContext
    params: dict[str, np.ndarray]
    meta: dict[str, Any]
    _module: Any = field(default=None, init=False, repr=False)  # built on first use of .module

    @property
    def classes(self) -> list[str] | None:
        return self.meta["data"].get("classes")

    @property
    def encoding(self) -> Encoding | None:
        """How raw table rows become features (None: the dataset was not a CSV/Parquet table)."""
        record = self.meta["data"].get("encoding")
        return None if record is None else Encoding.from_dict(record)

    def encode(self, rows: Any) -> np.ndarray:
        """Raw rows (DataFrame, dict of columns, list of dicts) -> feature rows as prepare wrote them (before
        normalization): unseen levels go to ``<rare>``, a missing value gets the recorded fill.

        >>> model.encode([{"island": "Dream", "bill_length_mm": "NA", ...}])   # doctest: +SKIP
        """
        encoding = self.encoding
        if encoding is None:
            raise InputError("this model's dataset records no table encoding, so rows must be arrays of features",
                             found=type(rows).__name__,
                             hint="pass a numpy array (rows x features); raw rows need a dataset prepared from a "
                                  "CSV or Parquet file by this memtrain")
        return encoding.rows(rows, np.dtype(self.meta["data"]["x"]["dtype"]))

    def _features(self, x: Any) -> np.ndarray:
        if isinstance(x, Iterator):
            x = list(x)  # a generator of rows is read once, here
        if is_raw(x) and (self.encoding is not None or not hasattr(x, "columns")):
            x = self.encode(x)  # (a DataFrame of features for a model without a table encoding is an array)
        try:
            x = np.asarray(x)
            x = x if x.dtype.kind in "biuf" else x.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError("the rows are not an array of numbers", expected="an array of features (rows x "
                             "features), or raw rows of a table (a DataFrame, a dict of columns, a list of dicts)",
                             found=f"{type(x).__name__} ({exc})") from None
        if x.ndim == 1:
            x = x.reshape(1, -1)
        if x.ndim == 0 or len(x) == 0:
            raise InputError("no rows", expected="at least one row of features", found=f"shape {x.shape}")
        width = self.context.spec.n_features
        flat = x.reshape(len(x), -1)
        if flat.shape[1] != width:
            raise InputError("wrong number of features", expected=width, found=flat.shape[1])
        bad = np.argwhere(~np.isfinite(flat))
        if len(bad):  # prepare refuses such values, so the model never saw one: its answer would mean nothing
            row, column = (int(v) for v in bad[0])
            raise InputError("a feature is not a finite number", where=f"row {row}, feature {column}",
                             expected="a finite number", found=repr(flat[row, column].item()))
        return self.context.normalize(x)

    def predict(self, x: Any) -> np.ndarray:
        """Class indices (classification; names via ``classes``) or predicted targets (regression).

        ``x``: an array of features (rows x features), or raw rows of a table (see ``encode``)."""
        return self.context.model.predict(self.params, self._features(x))

    @property
    def module(self) -> Any:
        """A torch model's ``torch.nn.Module`` with the trained weights, in eval mode (it takes normalized
        rows: ``predict`` and ``predict_proba`` normalize raw ones)."""
        to_module = getattr(self.context.model, "to_module", None)
        if to_module is None:
            raise InputError(f"model '{self.meta['model']['kind']}' is not a torch module",
                             hint="only kind = \"torch\" models have .module; use predict or .params")
        if self._module is None:
            self._module = to_module(self.params)
        return self._module

    def predict_proba(self, x: Any) -> np.ndarray:
        if not hasattr(self.context.model, "predict_proba"):
            raise InputError(f"model '{self.meta['model']['kind']}' does not give probabilities")
        return self.context.model.predict_proba(self.params, self._features(x))

    def evaluate(self, x: Any, y: Any) -> dict[str, float]:
        """The metrics training reports, on raw rows ``x`` with targets ``y`` (e.g. a test split).

        Classification: ``accuracy``, ``macro_f1`` and ``log_loss``; regression: ``r2``, ``mae``, ``rmse``.

        >>> model.evaluate(*open_dataset("data/digits").split("val")[:])   # doctest: +SKIP
        {'accuracy': 0.983, 'macro_f1': 0.983, 'log_loss': 0.061}
        """
        features = self._features(x)
        targets = self._targets(list(y) if isinstance(y, Iterator) else y, len(features))
        return combine([task_statistics(self.context, self.params, features, targets)], self.context)

    def _targets(self, y: Any, rows: int) -> np.ndarray:
        """``y`` checked against the model: class indices (whole numbers from 0) or class names for a
        classifier, finite numbers for a regression; one per row of x."""
        try:
            targets = np.asarray(y)
        except ValueError as exc:  # ragged
            raise InputError("y is not one label per row", expected=f"{rows} labels", found=str(exc)) from None
        if targets.ndim == 0 or len(targets) != rows:
            raise InputError("x and y have different numbers of rows", expected=rows,
                             found=len(targets) if targets.ndim else "a single value")
        if not self.context.classifier:
            return self._numbers(targets, "a finite number")
        classes = self.classes or []
        k = self.context.spec.n_classes
        if targets.ndim > 1 and targets.reshape(rows, -1).shape[1] != 1:
            raise InputError("y must hold one class per row", expected=f"shape ({rows},)", found=targets.shape)
        values = targets.reshape(rows)
        if values.dtype.kind in "USO":
            index = {name: i for i, name in enumerate(classes)}
            names = [v for v in values.tolist() if isinstance(v, str)]
            if len(names) == rows:
                unknown = [v for v in names if v not in index]
                if unknown:
                    raise InputError("a label in y is not one of the model's classes", found=repr(unknown[0]),
                                     expected="a class name (" + ", ".join(classes[:12]) + ") or a class index")
                return np.asarray([index[v] for v in names], dtype=np.int64)
        codes = self._numbers(values, f"a class index: a whole number from 0 to {k - 1}")
        bad = np.flatnonzero((codes != np.round(codes)) | (codes < 0) | (codes >= k))
        if len(bad):
            raise InputError("a label in y is not a class index", where=f"row {int(bad[0])}",
                             expected=f"a whole number from 0 to {k - 1} (or a class name)",
                             found=repr(values[int(bad[0])].tolist()))
        return codes.astype(np.int64)

    @staticmethod
    def _numbers(values: np.ndarray, expected: str) -> np.ndarray:
        try:
            numbers = values.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise InputError("y holds something that is not a number", expected=expected, found=str(exc)) from None
        bad = np.flatnonzero(~np.isfinite(numbers.reshape(len(numbers), -1)).all(axis=1))
        if len(bad):
            raise InputError("a value in y is not finite", where=f"row {int(bad[0])}", expected=expected,
                             found=repr(values[int(bad[0])].tolist()))
        return numbers

    def __repr__(self) -> str:
        kind, position = self.meta["model"]["kind"], self.meta.get("position", {})
        return f"TrainedModel({kind!r}, epoch {self.meta.get('epoch')}, weights version {position.get('version')})"


def load_model(path: str | Path, which: str | None = None) -> TrainedModel:
    """A trained model from a run directory (or one checkpoint directory), for prediction.

    By default the checkpoint of the run's best epoch (by ``train.monitor``, lowest ``val_loss`` unless the
    job says otherwise; ``run.keep_best``, on by default, keeps it), or the newest complete checkpoint when the
    run records no best epoch (no validation split) -- or, with a warning saying so, when the best epoch's
    checkpoint was not kept. ``which="last"``: the newest; ``which="best"``: the best epoch's, or an error saying why
    there is none.

    >>> model = load_model("runs/digits-mlp")                    # doctest: +SKIP
    >>> model.predict(raw_rows)                                  # same normalization as in training
    >>> load_model("runs/digits-mlp", which="last")              # doctest: +SKIP

    A reinforcement-learning run gives its policy instead (``memtrain.rl.act.Actor``), from its newest checkpoint:
    ``load_model("runs/cartpole-ppo").act(observations, greedy=True)`` (see the reinforcement-learning page).
    """
    path = Path(path)
    from memtrain.rl.kind import is_rl_run

    if is_rl_run(path) or is_rl_run(path.parent.parent):  # a reinforcement-learning run: its policy (docs/rl.md)
        from memtrain.rl.act import load_actor

        return load_actor(path, which)  # type: ignore[return-value] - an Actor: act(observations, greedy=True)
    if which is not None and which not in WHICH:
        raise InputError("bad value for which", expected=" or ".join(map(repr, WHICH)), found=repr(which))
    if (path / CHECKPOINTS_DIR).is_dir():
        found = newest_checkpoint(path, warn=lambda _: None)
        if found is None:
            raise InputError("the run has no complete checkpoint", path=path)
        path = pick_checkpoint(path, found[0], which, note=lambda text: warnings.warn(text, stacklevel=3))
    elif which == "best":
        raise InputError("which='best' needs a run directory", path=path,
                         hint="give the run directory (a checkpoint directory is loaded as it is)")
    params, meta = load_checkpoint(path)
    data = meta["data"]
    target = TargetScale.from_json(data.get("target_scale"), path / CHECKPOINT_META)
    context = model_context_from_manifest(data, meta["model"]["kind"], meta["model"]["options"], data["normalize"],
                                          target)
    return TrainedModel(context, params, meta)
