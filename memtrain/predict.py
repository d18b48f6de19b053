"""A run or checkpoint directory -> a model object with ``predict`` / ``predict_proba`` on raw features.

It applies the same normalization as training (the statistics are stored in the checkpoint), and maps
class indices back to class names with ``classes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import InputError
from memtrain.train.checkpoint import load_checkpoint
from memtrain.train.context import ModelContext, model_context_from_manifest


@dataclass
class TrainedModel:
    context: ModelContext
    params: dict[str, np.ndarray]
    meta: dict[str, Any]
    _module: Any = field(default=None, init=False, repr=False)  # built on first use of .module

    @property
    def classes(self) -> list[str] | None:
        return self.meta["data"].get("classes")

    def _features(self, x: Any) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim == 1:
            x = x.reshape(1, -1)
        width = self.context.spec.n_features
        if x.reshape(len(x), -1).shape[1] != width:
            raise InputError("wrong number of features", expected=width, found=x.reshape(len(x), -1).shape[1])
        return self.context.normalize(x)

    def predict(self, x: Any) -> np.ndarray:
        """Class indices (classification; names via ``classes``) or predicted targets (regression)."""
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


def load_model(path: str | Path) -> TrainedModel:
    """Load the newest complete checkpoint of a run (or a given checkpoint) for prediction.

    >>> model = load_model("runs/digits-mlp")          # doctest: +SKIP
    >>> model.predict(raw_rows)                          # same normalization as in training
    """
    params, meta = load_checkpoint(path)
    data = meta["data"]
    context = model_context_from_manifest(data, meta["model"]["kind"], meta["model"]["options"], data["normalize"])
    return TrainedModel(context, params, meta)
