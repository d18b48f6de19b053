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
from memtrain.models.registry import CODE_DIR, code_on_path, model_class
from memtrain.models.target_scale import ScaledTarget, TargetScale, scalable
from memtrain.train.normalize import Normalizer
from memtrain.train.outline import outline_model


@dataclass(frozen=True)
class ModelContext:
    spec: DataSpec
    model: Model
    layout: ParamLayout
    stats_layout: ParamLayout | None  # additive models: layout of the sufficient statistics (float64)
    normalize: Normalizer
    manifest: dict[str, Any]
    # CPU seconds this process spent building the model, its imports included (torch: seconds): what every
    # worker pays again as it starts (train/placement.py weighs it); an outline's: what its child spent
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


def server_context(dataset: Dataset, job: Any, *, resuming: bool = False, replaying: bool = False,
                   cores: int = 1) -> ModelContext:
    """The server's model context: the model itself, or (workers compute every gradient and the model asks
    for it, a torch module) its outline, built in a short child process (train/outline.py), so that the
    server never imports the framework. ``train.workers = "auto"`` outlines it too when the rounds it would
    run in the server can run on one worker instead (``auto_outlined``): the child is then kept, to become
    that worker. ``resuming``: a resume, which needs no version 0 from the outline; ``replaying``: a replay
    (the server's own engine); ``cores``: the machine's."""
    kind, options = job.model.kind, job.model.options
    workers = job.train.workers
    keep = workers == "auto" and auto_outlined(job, replaying=replaying, cores=cores)
    fixed = not isinstance(workers, str) and workers >= 1
    if not (fixed or keep) or job.run.cluster or not outlined(kind, options):
        return model_context(dataset, kind, options, job.data.normalize, job_target_scale(dataset, job))
    outline = outline_model(dataset=str(dataset.path), kind=kind, options=dict(options),
                            normalize=job.data.normalize, seed=job.train.seed, threads=job.train.blas_threads,
                            version0=not resuming, keep=keep)
    layout = ParamLayout.from_shapes(outline.parameter_shapes(), outline.buffer_shapes())
    return ModelContext(data_spec(dataset.manifest), outline, layout, None,
                        Normalizer.from_stats(dataset.manifest.get("stats"), job.data.normalize), dataset.manifest,
                        outline.build_seconds)


def auto_outlined(job: Any, *, replaying: bool, cores: int) -> bool:
    """Whether ``train.workers = "auto"`` runs the rounds (synchronous, on one machine, not a replay) with two
    or more participants to share an update's tasks: then the server's own rounds can run on one worker."""
    train = job.train
    return (not replaying and not job.run.cluster and train.mode == "sync" and train.staleness_in == "rounds"
            and min(cores, train.tasks_per_update) >= 2)


def outlined(kind: str, options: dict[str, Any]) -> bool:
    """Whether model ``kind`` asks to be outlined in a server that does not compute (``outlined = True``); its
    ``check_installed`` (if any) raises here, in the server, what building it would raise (a missing torch)."""
    with code_on_path(options.get(CODE_DIR)):
        cls = model_class(kind)
    if getattr(cls, "outlined", False) is not True:
        return False
    getattr(cls, "check_installed", lambda: None)()
    return True


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
