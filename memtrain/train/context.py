"""Dataset manifest + model options -> the model, its parameter layout and the feature normalizer.

Built the same way in the server, in every worker and in ``load_model``, so all three agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from memtrain.dataset import Dataset
from memtrain.models import build_model
from memtrain.models.params import ParamLayout
from memtrain.models.protocol import DataSpec, Model
from memtrain.models.target_scale import ScaledTarget, TargetScale, scalable
from memtrain.train.normalize import Normalizer


@dataclass(frozen=True)
class ModelContext:
    spec: DataSpec
    model: Model
    layout: ParamLayout
    stats_layout: ParamLayout | None  # additive models: layout of the sufficient statistics (float64)
    normalize: Normalizer
    manifest: dict[str, Any]
    # CPU seconds this process spent building the model, its imports included (torch: seconds): what every
    # worker pays again as it starts (train/server/placement.py weighs it); an outline's: what its child spent
    build_seconds: float = 0.0
    target: TargetScale | None = None  # data.scale_target: the model is trained on the standardized target

    @property
    def additive(self) -> bool:
        return bool(getattr(self.model, "additive", False))

    @property
    def classifier(self) -> bool:
        return self.spec.task == "classification"


def data_spec(manifest: dict[str, Any]) -> DataSpec:
    target_shape = tuple(manifest["y"]["shape"])
    classes = manifest.get("classes") or []
    return DataSpec(n_features=int(np.prod(manifest["x"]["shape"])), task=manifest["task"],
                    n_classes=len(classes), n_targets=int(np.prod(target_shape)) if target_shape else 1,
                    target_shape=target_shape, feature_shape=tuple(manifest["x"]["shape"]))


def model_context_from_manifest(manifest: dict[str, Any], kind: str, options: dict[str, Any],
                                normalize: bool, target: TargetScale | None = None) -> ModelContext:
    spec = data_spec(manifest)
    started = time.process_time()
    model = build_model(kind, options, spec)
    if target is not None and scalable(kind, spec.task):
        model = ScaledTarget(model, target, kind)
    else:
        target = None
    build_seconds = time.process_time() - started
    buffers = model.buffer_shapes() if hasattr(model, "buffer_shapes") else None
    layout = ParamLayout.from_shapes(model.parameter_shapes(), buffers)
    stats_layout = None
    if getattr(model, "additive", False):
        stats_layout = ParamLayout(ParamLayout.from_shapes(model.statistic_shapes()).entries, np.dtype(np.float64))
    return ModelContext(spec, model, layout, stats_layout, Normalizer.from_stats(manifest.get("stats"), normalize),
                        manifest, build_seconds, target)


def model_context(dataset: Dataset, kind: str, options: dict[str, Any], normalize: bool,
                  target: TargetScale | None = None) -> ModelContext:
    return model_context_from_manifest(dataset.manifest, kind, options, normalize, target)


def job_target_scale(dataset: Dataset, job: Any) -> TargetScale | None:
    """The target scale a job trains with (``data.scale_target``), from the training split; None if it does not
    apply (off, a classifier, a model other than linear and mlp)."""
    if not job.data.scale_target or not scalable(job.model.kind, dataset.manifest["task"]):
        return None
    return TargetScale.of_split(dataset.split("train"), data_spec(dataset.manifest).n_targets)


STARTUP_ROWS = 2


def startup_check(context: ModelContext, dataset: Dataset, threads: int) -> str | None:
    """A model's dry run on the first training rows, in the server before any worker starts (exit 2 on a
    model that cannot train on this data); returns what the model asks the run's event log to record."""
    startup = getattr(context.model, "startup", None)
    train = dataset.split("train")
    if startup is None or train.rows == 0:
        return None
    x, y = train.read(0, min(STARTUP_ROWS, train.rows))
    return startup(context.normalize(x), np.asarray(y), threads)
