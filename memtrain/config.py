"""Job file (TOML) + ``--set`` overrides -> a validated, frozen ``Job``; the one place defaults live.

Every default of a job is visible in the dataclasses below. Unknown sections or keys and wrong types are
``InputError``s naming the key and the file (exit 2). Paths in the file are relative to the file; paths given
on the command line (``--set data.path=...``, ``--run-dir``) or from Python are relative to the current directory.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memtrain.errors import InputError, did_you_mean
from memtrain.train.optim import OptimizerConfig


@dataclass(frozen=True)
class DataConfig:
    path: Path = Path("data/digits")  # a prepared dataset directory
    normalize: bool = True  # standardize features with the manifest's train statistics, on the fly
    verify: bool = False  # re-hash every shard against the manifest before training


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "mlp"  # linear | logistic | softmax | mlp | ridge | naive_bayes | "pkg.module:Class"
    options: dict[str, Any] = field(default_factory=dict)  # every other key of [model], checked by the model


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 10
    batch_size: int | None = None  # None: one update per epoch (full batch), as in the design card
    tasks_per_update: int = 4  # how each update is cut into tasks; never depends on the worker count
    workers: int | str = "auto"  # worker processes; 0: the server trains alone; "auto": measured at start
    seed: int = 0
    blas_threads: int = 1  # per worker: N workers x all-core BLAS oversubscribes the machine
    eval_rows: int = 8192  # validation rows per evaluation task
    task_timeout: float = 600.0  # seconds before a silent task's worker is killed and the task re-run
    max_attempts: int = 3  # a task that kills its worker this many times stops the run
    on_nonfinite: str = "stop"  # "stop" | "skip": what a NaN/Inf loss or gradient does to the update
    patience: int | None = None  # stop after this many epochs without a better val_loss; None: never stop early
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)


@dataclass(frozen=True)
class RunConfig:
    dir: Path = Path("runs/default")
    checkpoint_every: int = 1  # epochs
    keep_checkpoints: int = 3
    keep_best: bool = False  # also keep the best epoch's checkpoint (by val_loss), whatever keep_checkpoints prunes
    keep_versions: int = 3  # weight versions left on disk for inspection
    exchange: str = "auto"  # "auto" (measure /dev/shm vs the run's filesystem) | "shm" | "run" | a directory


@dataclass(frozen=True)
class Job:
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    run: RunConfig
    source: Path | None = None  # the job file it came from


OPTIMIZER_KEYS = tuple(f.name for f in dataclasses.fields(OptimizerConfig))
OPTIMIZER_RENAMES = {"optimizer": "name"}  # [train] optimizer = "adam" is OptimizerConfig.name
SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "run": RunConfig}
EXCHANGE_CHOICES = ("auto", "shm", "run")  # any other run.exchange value is a directory


def load_job(path: str | os.PathLike[str] | None, overrides: typing.Sequence[str] = (), *,
             workers: int | None = None, run_dir: str | os.PathLike[str] | None = None,
             values: typing.Mapping[str, Any] | None = None) -> Job:
    """Read a job file, apply overrides and validate it.

    ``overrides`` are ``section.key=value`` strings (values in TOML syntax, as ``--set`` takes them);
    ``values`` are the same as Python values by dotted key. Paths in the file are relative to the file;
    paths in overrides, values and ``run_dir`` are relative to the current directory.

    >>> job = load_job("jobs/examples/digits-mlp.toml", values={"train.epochs": 5})   # doctest: +SKIP
    """
    path = Path(path) if path is not None else None
    raw: dict[str, Any] = _read_toml(path) if path is not None else {}
    base = path.resolve().parent if path is not None else Path.cwd()
    _apply_overrides(raw, overrides, values, workers)
    if run_dir is not None:
        raw.setdefault("run", {})["dir"] = os.path.abspath(run_dir)
    if path is not None:
        raw.setdefault("run", {}).setdefault("dir", str(Path("runs") / path.stem))
    return job_from_dict(raw, base=base, source=path)


def load_saved_job(run_dir: str | os.PathLike[str], overrides: typing.Sequence[str] = (), *,
                   workers: int | None = None, values: typing.Mapping[str, Any] | None = None) -> Job:
    """The job a run directory follows (for ``--resume``): its record with the changes of its history, then
    ``overrides`` such as more epochs. ``run.dir`` is ``run_dir``, wherever the directory has been moved."""
    from memtrain.errors import CorruptFileError
    from memtrain.train.record import recorded_job
    from memtrain.train.run_dir import damaged_record

    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise InputError("no run directory here", path=run_dir,
                         hint=f"start a run there with `memtrain train JOB.toml --run-dir {run_dir}`")
    try:
        raw = recorded_job(run_dir)
    except CorruptFileError as exc:
        raise damaged_record(exc, run_dir, None) from None
    _apply_overrides(raw, overrides, values, workers)
    return job_from_dict(raw, base=run_dir, source=None)


def _apply_overrides(raw: dict[str, Any], overrides: typing.Sequence[str], values: typing.Mapping[str, Any] | None,
                     workers: int | None) -> None:
    for item in overrides:
        _apply_override(raw, item)
    for key, value in (values or {}).items():
        section, dot, name = key.partition(".")
        if not dot or not name:
            raise InputError("an override takes a section.key name", expected="e.g. train.lr", found=key)
        _set_value(raw, section, name, value)
    if workers is not None:
        raw.setdefault("train", {})["workers"] = workers


def job_from_dict(raw: dict[str, Any], *, base: Path, source: Path | None = None) -> Job:
    """Validate a job given as nested dicts (a parsed TOML file, or a saved ``job.json``)."""
    where = source or "job"
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        name = sorted(unknown)[0]
        raise InputError(f"unknown section [{name}]", path=where,
                         expected=f"one of {', '.join(f'[{s}]' for s in SECTIONS)}", hint=did_you_mean(name, SECTIONS))
    for name, value in raw.items():
        if not isinstance(value, dict):
            raise InputError(f"'{name}' must be a table [{name}]", path=where, found=type(value).__name__)
    data = _build(DataConfig, raw.get("data", {}), "data", where)
    model = _model_config(raw.get("model", {}), where)
    train = _train_config(raw.get("train", {}), where)
    run = _build(RunConfig, raw.get("run", {}), "run", where)
    data = dataclasses.replace(data, path=(base / data.path).resolve())
    run = dataclasses.replace(run, dir=(base / run.dir).resolve())
    if run.exchange not in EXCHANGE_CHOICES:
        run = dataclasses.replace(run, exchange=str((base / run.exchange).resolve()))
    return Job(data, model, train, run, source.resolve() if source else None)


def job_to_dict(job: Job) -> dict[str, Any]:
    """The resolved job as plain JSON-able data (every default filled in, paths absolute)."""
    train = {f.name: getattr(job.train, f.name) for f in dataclasses.fields(TrainConfig) if f.name != "optimizer"}
    for key in OPTIMIZER_KEYS:
        train[{v: k for k, v in OPTIMIZER_RENAMES.items()}.get(key, key)] = getattr(job.train.optimizer, key)
    return {
        "data": {"path": str(job.data.path), "normalize": job.data.normalize, "verify": job.data.verify},
        "model": {"kind": job.model.kind, **job.model.options},
        "train": train,
        "run": {**{f.name: getattr(job.run, f.name) for f in dataclasses.fields(RunConfig)}, "dir": str(job.run.dir)},
    }


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except FileNotFoundError as exc:
        raise InputError("job file not found", path=path) from exc
    except IsADirectoryError as exc:
        raise InputError("expected a job file, found a directory", path=path) from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"not valid TOML: {exc}", path=path) from exc


def _apply_override(raw: dict[str, Any], item: str) -> None:
    key, sep, text = item.partition("=")
    section, dot, name = key.strip().partition(".")
    if not sep or not dot or not name:
        raise InputError("--set takes section.key=value", where="--set", expected="e.g. train.lr=0.01",
                         found=item)
    try:
        value = tomllib.loads(f"v = {text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = text.strip()  # a bare word: take it as a string
    _set_value(raw, section.strip(), name, value)


def _set_value(raw: dict[str, Any], section: str, name: str, value: Any) -> None:
    """One override. A path given here is relative to the current directory, not to the job file."""
    if isinstance(value, str | os.PathLike) and _names_a_path(section, name, value):
        value = os.path.abspath(os.path.expanduser(value))
    raw.setdefault(section, {})[name] = value


def _names_a_path(section: str, name: str, value: Any) -> bool:
    return (section, name) in (("data", "path"), ("run", "dir")) or (
        (section, name) == ("run", "exchange") and value not in EXCHANGE_CHOICES)


def _model_config(values: dict[str, Any], where: Any) -> ModelConfig:
    values = dict(values)
    kind = values.pop("kind", ModelConfig.kind)
    if not isinstance(kind, str):
        raise InputError("wrong type for model.kind", path=where, expected="a string", found=repr(kind))
    return ModelConfig(kind, values)


def _train_config(values: dict[str, Any], where: Any) -> TrainConfig:
    values = dict(values)
    optimizer_values = {OPTIMIZER_RENAMES.get(k, k): values.pop(k) for k in list(values)
                        if OPTIMIZER_RENAMES.get(k, k) in OPTIMIZER_KEYS}
    optimizer = _build(OptimizerConfig, optimizer_values, "train", where)
    train = _build(TrainConfig, values, "train", where, optimizer=optimizer)
    _check_train(train, where)
    return train


def _check_train(train: TrainConfig, where: Any) -> None:
    if train.workers != "auto" and (not isinstance(train.workers, int) or train.workers < 0):
        raise InputError("bad value for train.workers", path=where,
                         expected='"auto", 0 (the server trains alone) or a number of worker processes',
                         found=repr(train.workers))
    positive = {"epochs": train.epochs, "tasks_per_update": train.tasks_per_update,
                "blas_threads": train.blas_threads, "eval_rows": train.eval_rows,
                "max_attempts": train.max_attempts}
    if train.batch_size is not None:
        positive["batch_size"] = train.batch_size
    if train.patience is not None:
        positive["patience"] = train.patience
    for key, value in positive.items():
        if value < 1:
            raise InputError(f"train.{key} must be at least 1", path=where, found=value)
    if train.task_timeout <= 0:
        raise InputError("train.task_timeout must be positive", path=where, found=train.task_timeout)
    if train.on_nonfinite not in ("stop", "skip"):
        raise InputError("bad value for train.on_nonfinite", path=where, expected="'stop' or 'skip'",
                         found=repr(train.on_nonfinite))


def _build(cls: type, values: dict[str, Any], section: str, where: Any, **fixed: Any) -> Any:
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)} - set(fixed)
    for key, value in values.items():
        if key not in names:
            allowed = sorted(names | (set(OPTIMIZER_KEYS) - {"name"} | {"optimizer"} if section == "train" else set()))
            raise InputError(f"unknown key {section}.{key}", path=where, expected=f"one of {', '.join(allowed)}",
                             hint=did_you_mean(key, allowed))
        _check_type(hints[key], value, f"{section}.{key}", where)
    try:
        return cls(**{k: _convert(hints[k], v) for k, v in values.items()}, **fixed)
    except InputError as exc:
        exc.path = exc.path or where
        raise


def _check_type(hint: Any, value: Any, key: str, where: Any) -> None:
    if not _matches(hint, value):
        raise InputError(f"wrong type for {key}", path=where, expected=_type_name(hint), found=repr(value))


def _matches(hint: Any, value: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(arg, value) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint in (str, Path):
        return isinstance(value, str)
    return True


def _type_name(hint: Any) -> str:
    args = typing.get_args(hint)
    if args:
        return " or ".join(_type_name(a) for a in args)
    return {type(None): "nothing", Path: "a path string"}.get(hint, getattr(hint, "__name__", str(hint)))


def _convert(hint: Any, value: Any) -> Any:
    if hint is Path:
        return Path(value)
    if hint is float and isinstance(value, int):
        return float(value)
    return value
