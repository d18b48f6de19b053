"""Job file (TOML) + ``--set`` overrides -> a validated, frozen ``Job``; the one place defaults live.

Every default of a job is visible in the dataclasses below. Unknown sections or keys, wrong types and values
out of range (``RANGES``, checked by every config class when it is made) are ``InputError``s naming the key,
the file, the range and the value found (exit 2). Paths in the file are relative to the file; paths given
on the command line (``--set data.path=...``, ``--run-dir``) or from Python are relative to the current directory.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import sys
import tomllib
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

from memtrain.errors import InputError, did_you_mean
from memtrain.models.registry import IMPORT_OPTIONS, import_path
from memtrain.order import SHUFFLES, WINDOW

# Bound of train.workers (and train.blas_threads): each worker is a process with its own maps, two pipes and
# a slice of every step; thousands of them is a typo, and would exhaust the server's file descriptors first.
MAX_WORKERS = 1024
# numpy seeds its generators with non-negative integers; a TOML integer is at most 2**63 - 1.
MAX_SEED = 2**63 - 1
# Upper bounds of the job's other integers. Python's TOML reader and --set take integers of any size, but what
# they count ends in numpy shapes and C integers (the round records hold one column per task, and a dimension
# must fit a C int), in file names (a task's gradient buffer is g-tNNNNN.npy) and in checkpoints, which refuse
# counts above 10^12 (train/records/checkpoint.py MAX_COUNT): a value past these would start a run that fails the same
# way at every resume. Each bound is far past any real job: a value beyond it is a typo.
MAX_EPOCHS = 10**6  # train.epochs, train.patience, run.checkpoint_every
MAX_ROWS = 2**40  # rows at once: train.batch_size, eval_rows, chunk_rows, shuffle_window (4 TiB of one float32 column)
# train.tasks_per_update: each task has its own gradient buffer in the exchange area, mapped by every participant
# (a file descriptor per map: the start checks the process's limit, train/server/room.py open_files_needed)
MAX_TASKS = 1024
MAX_ATTEMPTS = 1000  # train.max_attempts: deaths of one piece of work before the run stops
MAX_KEPT = 10**4  # run.keep_checkpoints, run.keep_versions: files kept on disk
MAX_FLOAT = int(sys.float_info.max)  # an integer given for a float key converts only up to this
EXCHANGE_CHOICES = ("auto", "shm", "run")  # any other run.exchange value is a directory that must exist


def _integers(low: int, high: int | None = None) -> tuple[str, Callable[[Any], bool]]:
    text = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    return text, lambda v: isinstance(v, int) and low <= v and (high is None or v <= high)


def _workers() -> tuple[str, Callable[[Any], bool]]:
    text = (f'"auto" (measured at start), 0 (the server trains alone) or a number of worker processes '
            f'up to {MAX_WORKERS}')
    return text, lambda v: v == "auto" or (isinstance(v, int) and 0 <= v <= MAX_WORKERS)


def _server_threads() -> tuple[str, Callable[[Any], bool]]:
    text = f'"auto" (measured at start) or a number of threads from 1 to {MAX_WORKERS}'
    return text, lambda v: v == "auto" or (isinstance(v, int) and 1 <= v <= MAX_WORKERS)


def _positive_finite(unit: str) -> tuple[str, Callable[[Any], bool]]:
    return f"a finite number of {unit} > 0", lambda v: isinstance(v, int | float) and math.isfinite(v) and v > 0


# The range of every numeric job value ([train] optimizer keys are checked by OptimizerConfig; [model] keys by
# the model). Checked when a config object is made, whoever makes it: a job file, --set, job.json on resume,
# or Python code; a value out of range stops the job before anything is written.
RANGES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "train.epochs": _integers(1, MAX_EPOCHS),
    "train.batch_size": _integers(1, MAX_ROWS),
    "train.tasks_per_update": _integers(1, MAX_TASKS),
    "train.workers": _workers(),
    "train.server_threads": _server_threads(),
    "train.seed": _integers(0, MAX_SEED),
    "train.blas_threads": _integers(1, MAX_WORKERS),
    "train.eval_rows": _integers(1, MAX_ROWS),
    "train.shuffle_window": _integers(1, MAX_ROWS),
    "train.chunk_rows": _integers(1, MAX_ROWS),
    "train.task_timeout": _positive_finite("seconds"),
    "train.max_attempts": _integers(1, MAX_ATTEMPTS),
    "train.backup_ratio": ("0 (no backup copies) or a finite number >= 1",
                           lambda v: isinstance(v, int | float) and math.isfinite(v) and (v == 0 or v >= 1)),
    "train.backup_seconds": ("a finite number of seconds >= 0",
                             lambda v: isinstance(v, int | float) and math.isfinite(v) and v >= 0),
    "train.patience": _integers(1, MAX_EPOCHS),
    "run.checkpoint_every": _integers(1, MAX_EPOCHS),
    "run.keep_checkpoints": _integers(1, MAX_KEPT),
    "run.keep_versions": _integers(1, MAX_KEPT),
}


def check_ranges(config: Any, section: str) -> None:
    """InputError for the first value of ``config`` (a [section] dataclass) outside its range in RANGES."""
    for field_ in dataclasses.fields(config):
        key = f"{section}.{field_.name}"
        value = getattr(config, field_.name)
        if key not in RANGES or value is None:
            continue
        expected, holds = RANGES[key]
        if isinstance(value, bool) or not holds(value):
            raise InputError(f"{key} out of range", expected=expected, found=repr(value))


# [train]'s optimizer options (train/optim.py steps them; its table's names are these)
OPTIMIZER_NAMES = ("sgd", "adam", "adamw")
SCHEDULES = ("constant", "cosine", "step")


@dataclass(frozen=True)
class OptimizerConfig:
    """Every optimizer and schedule option, with its default ([train] keys of a job file)."""

    name: str = "adam"  # "sgd" | "adam" | "adamw"  (job key: train.optimizer)
    lr: float = 1e-3
    momentum: float = 0.0  # sgd
    nesterov: bool = False  # sgd, requires momentum > 0
    weight_decay: float = 0.0  # sgd/adam: L2 term added to the gradient; adamw: decoupled decay
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    schedule: str = "constant"  # "constant" | "cosine" | "step", applied after the warmup
    warmup_updates: int = 0  # linear warmup: lr/warmup_updates, 2*lr/warmup_updates, ..., lr
    step_every: int = 1000  # step schedule: multiply by step_gamma every step_every updates
    step_gamma: float = 0.1
    min_lr: float = 0.0  # cosine floor

    def __post_init__(self) -> None:
        _check_choice("train.optimizer", self.name, OPTIMIZER_NAMES)
        _check_choice("train.schedule", self.schedule, SCHEDULES)
        _check_number("train.lr", self.lr, "a number > 0", lambda v: v > 0)
        _check_number("train.momentum", self.momentum, "a number in [0, 1)", lambda v: 0 <= v < 1)
        _check_number("train.weight_decay", self.weight_decay, "a number >= 0", lambda v: v >= 0)
        _check_number("train.beta1", self.beta1, "a number in [0, 1)", lambda v: 0 <= v < 1)
        _check_number("train.beta2", self.beta2, "a number in [0, 1)", lambda v: 0 <= v < 1)
        _check_number("train.eps", self.eps, "a number > 0", lambda v: v > 0)
        _check_number("train.step_gamma", self.step_gamma, "a number in (0, 1]", lambda v: 0 < v <= 1)
        _check_number("train.min_lr", self.min_lr, f"a number in [0, lr={self.lr}]", lambda v: 0 <= v <= self.lr)
        _check_int("train.warmup_updates", self.warmup_updates, 0)
        _check_int("train.step_every", self.step_every, 1)
        if not isinstance(self.nesterov, bool):
            raise InputError("wrong type for train.nesterov", expected="true or false", found=repr(self.nesterov))
        if self.nesterov and (self.name != "sgd" or self.momentum == 0):
            raise InputError("train.nesterov needs optimizer 'sgd' with momentum > 0",
                             expected="train.momentum > 0 and train.optimizer = 'sgd'",
                             found=f"optimizer {self.name!r}, momentum {self.momentum}")


def _check_choice(key: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise InputError(f"bad value for {key}", expected=" or ".join(repr(c) for c in choices), found=repr(value))


def _check_number(key: str, value: object, expected: str, ok) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value) or not ok(value):
        raise InputError(f"bad value for {key}", expected=expected, found=repr(value))


# Upper bound of the schedule's counts of updates: a checkpoint refuses counts above 10^12 (train/records/checkpoint.py
# MAX_COUNT), so no run makes more updates; a larger value is a typo (config.py, "Upper bounds").
MAX_UPDATES = 10**12


def _check_int(key: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= MAX_UPDATES:
        raise InputError(f"bad value for {key}", expected=f"an integer from {minimum} to {MAX_UPDATES}",
                         found=repr(value))


# Metrics of an epoch record (metrics.jsonl) that can pick the best epoch, by what "better" means for them.
LOWER_IS_BETTER = ("val_loss", "val_log_loss", "val_rmse", "val_mae", "loss")
HIGHER_IS_BETTER = ("val_accuracy", "val_macro_f1", "val_r2")
MONITORED = LOWER_IS_BETTER + HIGHER_IS_BETTER
MONITOR_MODES = ("auto", "min", "max")
LOG_TO = ("csv", "tensorboard")
TENSORBOARD_INSTALL = "pip install tensorboardX (or pip install 'memtrain[tensorboard]')"


def check_log_to(log_to: typing.Sequence[str], where: Any) -> None:
    """``run.log_to``: known names, each once; "tensorboard" needs tensorboardX installed."""
    for name in log_to:
        if name not in LOG_TO:
            raise InputError("bad value in run.log_to", path=where, expected=f"a list of {' and '.join(LOG_TO)}",
                             found=repr(name))
    if len(set(log_to)) != len(log_to):
        raise InputError("run.log_to names a log twice", path=where, found=repr(list(log_to)))
    if "tensorboard" in log_to and importlib.util.find_spec("tensorboardX") is None:
        raise InputError("run.log_to = [\"tensorboard\"] needs the tensorboardX package, which is not installed",
                         path=where, hint=TENSORBOARD_INSTALL)


@dataclass(frozen=True)
class DataConfig:
    path: Path = Path("data/digits")  # a prepared dataset directory
    normalize: bool = True  # standardize features with the manifest's train statistics, on the fly
    # train a regression target standardized (the training split's mean and std; linear and mlp only: ridge
    # solves exactly); predictions, metrics and exports stay in the target's units (models/target_scale.py)
    scale_target: bool = True
    verify: bool = False  # re-hash every shard against the manifest before training


@dataclass(frozen=True)
class ModelConfig:
    kind: str = "mlp"  # linear | logistic | softmax | mlp | ridge | naive_bayes | torch | "pkg.module:Class"
    # every other key of [model], checked by the model; a model of the user's own code (torch, or a class
    # path) also gets code_dir: where its code is imported from first (default: the job file's directory)
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 10
    batch_size: int | None = None  # None: one update per epoch (full batch), as in the design card
    tasks_per_update: int = 4  # how each update is cut into tasks; never depends on the worker count
    workers: int | str = "auto"  # worker processes; 0: the server trains alone; "auto": measured at start
    seed: int = 0
    blas_threads: int = 1  # per worker: N workers x all-core BLAS oversubscribes the machine
    # the server running the rounds itself: threads computing an update's tasks at once (train/server/placement.py)
    server_threads: int | str = "auto"
    eval_rows: int = 8192  # validation rows per evaluation task
    chunk_rows: int = 32768  # additive models: rows a statistics task reads at once (bounds its memory)
    task_timeout: float = 600.0  # seconds before a silent task's worker is killed and the task re-run
    max_attempts: int = 3  # a task that kills its worker this many times stops the run
    # a cluster's straggler rule (docs/cluster.md): a task running more than backup_ratio x the median time of
    # its finished peers, and at least backup_seconds, gets a backup copy on an idle worker; 0: never
    backup_ratio: float = 3.0
    backup_seconds: float = 0.5
    on_nonfinite: str = "stop"  # "stop" | "skip": what a NaN/Inf loss or gradient does to the update
    mode: str = "sync"  # "sync": the plan fixes every gradient's version | "async": arrival order (async.md)
    staleness: int = 0  # sync: gradients of update n are computed at the weights of k updates earlier
    staleness_in: str = "rounds"  # "rounds": workers step, meet once per update | "stream": the server steps
    max_staleness: int | None = None  # async only (default 4): a staler gradient is recomputed, never applied
    async_group: int | None = None  # async only (default 1): gradients applied together, in arrival order
    patience: int | None = None  # stop after this many epochs without a better train.monitor; None: never
    monitor: str = "val_loss"  # the epoch metric that picks the best epoch (and early stopping):
    # train/server/monitor.py
    monitor_mode: str = "auto"  # "min" | "max" | "auto": lower is better for losses and errors, higher otherwise
    # each epoch's row order (memtrain/order.py): "rows" mixes rows into new batches every epoch (shuffled within
    # windows of shuffle_window rows, one block from each stratum of the split) | "batches": the same batches every
    # epoch, visited in a seeded order (memtrain before row shuffling) | "none": file order
    shuffle: str = "rows"
    shuffle_window: int = WINDOW
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)

    def __post_init__(self) -> None:
        check_ranges(self, "train")


@dataclass(frozen=True)
class RunConfig:
    dir: Path = Path("runs/default")
    checkpoint_every: int = 1  # epochs
    keep_checkpoints: int = 3
    # also keep the best epoch's checkpoint (train.monitor), whatever keep_checkpoints prunes: it is what
    # load_model and inspect --export hand back by default. An improving epoch off the checkpoint_every schedule
    # only copies its files, unsynced; the copy is committed once when the run stops (checkpoint.StagedBest: a
    # checkpoint per improving epoch made the README's first job 3x slower). "auto" (an older default) is true.
    keep_best: bool | str = True
    keep_versions: int = 3  # weight versions left on disk for inspection
    exchange: str = "auto"  # "auto" (/dev/shm if it has room, else the run's filesystem) | "shm" | "run" | a directory
    cluster: str = ""  # "": worker processes on this machine; "tcp://HOST:PORT" or "local:N": Dask workers
    log_to: tuple[str, ...] = ()  # also write the epoch metrics for other tools: "csv", "tensorboard"

    def __post_init__(self) -> None:
        check_ranges(self, "run")


@dataclass(frozen=True)
class Job:
    data: DataConfig
    model: ModelConfig
    train: TrainConfig
    run: RunConfig
    source: Path | None = None  # the job file it came from
    # run.dir is the name memtrain chose (runs/<job file name>), not one the job or the command named: a new run
    # there goes beside an earlier one (runs/job-2, ...) instead of being refused. Not recorded (nor is run.dir).
    default_dir: bool = False

    def __post_init__(self) -> None:
        """``run.keep_best`` resolved to a bool whoever builds the job (a job file, ``memtrain.fit``, a script
        making ``Job(...)``): left as ``"auto"``, a non-empty string, it would read as true everywhere."""
        if not isinstance(self.run.keep_best, bool):
            object.__setattr__(self, "run", dataclasses.replace(
                self.run, keep_best=_keep_best(self.run.keep_best, self.train, self.source or "job")))


OPTIMIZER_KEYS = tuple(f.name for f in dataclasses.fields(OptimizerConfig))
OPTIMIZER_RENAMES = {"optimizer": "name"}  # [train] optimizer = "adam" is OptimizerConfig.name
SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig, "run": RunConfig}


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
    default_dir = "dir" not in raw.get("run", {})  # memtrain names it: a rerun goes beside it (run_dir.beside_earlier)
    if path is not None:
        raw.setdefault("run", {}).setdefault("dir", str(Path("runs") / path.stem))
    return dataclasses.replace(job_from_dict(raw, base=base, source=path), default_dir=default_dir)


def saved_job(raw: dict[str, Any], run_dir: Path, overrides: typing.Sequence[str] = (), *,
              workers: int | None = None, values: typing.Mapping[str, Any] | None = None) -> Job:
    """The job a run directory follows (``raw``: its record with the changes of its history, read by
    train/records/run_dir.py's ``load_saved_job``), then ``overrides`` such as more epochs; ``run.dir`` is
    ``run_dir``."""
    from memtrain.layout import RUN_JOB

    _apply_overrides(raw, overrides, values, workers)
    return job_from_dict(raw, base=run_dir, source=None, where=run_dir / RUN_JOB)


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


def job_from_dict(raw: dict[str, Any], *, base: Path, source: Path | None = None,
                  where: Path | None = None) -> Job:
    """Validate a job given as nested dicts (a parsed TOML file, or a saved ``job.json``).

    Errors name ``where`` (the file the job came from when it is not ``source``: a run's ``job.json``, a
    job a service received), else ``source``, else ``job`` (a job made in Python)."""
    where = where or source or "job"
    if "env" in raw:  # a reinforcement-learning job (docs/rl.md): validated whole, then refused until it runs
        from memtrain.rl.config import rl_job_from_dict

        rl_job_from_dict(raw, base=base, source=source, where=where)
        raise InputError("a reinforcement-learning job ([env]) is run by `memtrain train JOB.toml`, not as a "
                         "supervised job", path=where,
                         hint="memtrain train runs it (synchronous PPO and A2C, docs/rl.md); in Python, "
                              "memtrain.rl.config.load_rl_job reads it")
    unknown = set(raw) - set(SECTIONS)
    if unknown:
        name = sorted(unknown)[0]
        raise InputError(f"unknown section [{name}]", path=where,
                         expected=f"one of {', '.join(f'[{s}]' for s in SECTIONS)}", hint=did_you_mean(name, SECTIONS))
    for name, value in raw.items():
        if not isinstance(value, dict):
            raise InputError(f"'{name}' must be a table [{name}]", path=where, found=type(value).__name__)
    data = _build(DataConfig, raw.get("data", {}), "data", where)
    model = _model_config(raw.get("model", {}), where, base)
    train = _train_config(raw.get("train", {}), where)
    run = _build(RunConfig, raw.get("run", {}), "run", where)
    _check_run(run, where)
    run = dataclasses.replace(run, keep_best=_keep_best(run.keep_best, train, where))
    data = dataclasses.replace(data, path=(base / data.path).resolve())
    run = dataclasses.replace(run, dir=(base / run.dir).resolve())
    if run.exchange not in EXCHANGE_CHOICES:
        run = dataclasses.replace(run, exchange=str((base / run.exchange).resolve()))
    _check_exchange(run.exchange, where)
    return Job(data, model, train, run, source.resolve() if source else None)


def job_to_dict(job: Job) -> dict[str, Any]:
    """The resolved job as plain JSON-able data (every default filled in, paths absolute)."""
    train = {f.name: getattr(job.train, f.name) for f in dataclasses.fields(TrainConfig) if f.name != "optimizer"}
    for key in OPTIMIZER_KEYS:
        train[{v: k for k, v in OPTIMIZER_RENAMES.items()}.get(key, key)] = getattr(job.train.optimizer, key)
    return {
        "data": {"path": str(job.data.path), "normalize": job.data.normalize, "scale_target": job.data.scale_target,
                 "verify": job.data.verify},
        "model": {"kind": job.model.kind, **job.model.options},
        "train": train,
        "run": {**{f.name: getattr(job.run, f.name) for f in dataclasses.fields(RunConfig)}, "dir": str(job.run.dir),
                "log_to": list(job.run.log_to)},
    }


def _read_toml(path: Path) -> dict[str, Any]:
    from memtrain.files import open_regular

    try:
        with open_regular(path, what="a job file", error=InputError) as handle:
            return tomllib.load(handle)
    except FileNotFoundError as exc:
        raise InputError("job file not found", path=path) from exc
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
    return (section, name) in (("data", "path"), ("run", "dir"), ("model", "code_dir")) or (
        (section, name) == ("run", "exchange") and value not in EXCHANGE_CHOICES)


def _model_config(values: dict[str, Any], where: Any, base: Path) -> ModelConfig:
    values = dict(values)
    kind = values.pop("kind", ModelConfig.kind)
    if not isinstance(kind, str):
        raise InputError("wrong type for model.kind", path=where, expected="a string", found=repr(kind))
    for key, text in (("kind", kind), *((k, values.get(k)) for k in IMPORT_OPTIONS)):
        if isinstance(text, str) and ":" in text:  # the user's code: a module's dotted name, never a path
            try:
                import_path(text, f"model.{key}")
            except InputError as exc:
                exc.path = where
                raise
    if ":" in kind or kind == "torch" or "code_dir" in values:
        code_dir = values.get("code_dir", ".")
        if not isinstance(code_dir, str):
            raise InputError("wrong type for model.code_dir", path=where, expected="a path string",
                             found=repr(code_dir))
        values["code_dir"] = str((base / code_dir).resolve())
    return ModelConfig(kind, values)


def _train_config(values: dict[str, Any], where: Any) -> TrainConfig:
    values = dict(values)
    optimizer_values = {OPTIMIZER_RENAMES.get(k, k): values.pop(k) for k in list(values)
                        if OPTIMIZER_RENAMES.get(k, k) in OPTIMIZER_KEYS}
    optimizer = _build(OptimizerConfig, optimizer_values, "train", where)
    train = _build(TrainConfig, values, "train", where, optimizer=optimizer)
    return _check_train(train, where)


def _check_exchange(exchange: str, where: Any) -> None:
    """run.exchange names a place that exists: it is never created (a typo would make a folder at /)."""
    if exchange == "shm" and not os.path.isdir("/dev/shm"):
        raise InputError("run.exchange = 'shm' but this machine has no /dev/shm", path=where,
                         expected="'auto', 'run' or an existing directory", found=repr(exchange))
    if exchange not in EXCHANGE_CHOICES and not os.path.isdir(exchange):
        found = "a file" if os.path.lexists(exchange) else "nothing there"
        raise InputError(f"run.exchange is not an existing directory: {exchange}", path=where,
                         expected=f"{' or '.join(repr(c) for c in EXCHANGE_CHOICES)}, or an existing directory",
                         found=found, hint="create the directory first, or use run.exchange = 'auto'")


def _check_train(train: TrainConfig, where: Any) -> TrainConfig:
    if train.on_nonfinite not in ("stop", "skip"):
        raise InputError("bad value for train.on_nonfinite", path=where, expected="'stop' or 'skip'",
                         found=repr(train.on_nonfinite))
    if train.monitor not in MONITORED:
        raise InputError("bad value for train.monitor", path=where, expected=f"one of {', '.join(MONITORED)}",
                         found=repr(train.monitor), hint=did_you_mean(train.monitor, MONITORED))
    if train.monitor_mode not in MONITOR_MODES:
        raise InputError("bad value for train.monitor_mode", path=where,
                         expected=" or ".join(map(repr, MONITOR_MODES)), found=repr(train.monitor_mode))
    if train.shuffle not in SHUFFLES:
        raise InputError("bad value for train.shuffle", path=where, expected=" or ".join(map(repr, SHUFFLES)),
                         found=repr(train.shuffle))
    return _check_mode(train, where)


# Upper bound of the staleness keys (and of async_group). Each unit of staleness keeps one more weight
# version alive (on disk, and in every checkpoint of a fixed-staleness run), and past a few dozen updates a
# gradient says little about the weights it is applied to; a group of more than 64 gradients is a larger
# train.batch_size. A larger value is far more likely a typo than a plan.
MAX_STALENESS = 64
ASYNC_DEFAULTS = {"max_staleness": 4, "async_group": 1}
STALENESS_IN = ("rounds", "stream")  # how a fixed staleness runs (docs/async.md)


def _check_mode(train: TrainConfig, where: Any) -> TrainConfig:
    """Check the mode keys (async.md); returns ``train`` with the async defaults filled in."""
    if train.mode not in ("sync", "async"):
        raise InputError("bad value for train.mode", path=where, expected="'sync' or 'async'", found=repr(train.mode))
    _check_range("staleness", train.staleness, 0, where)
    if train.staleness_in not in STALENESS_IN:
        raise InputError("bad value for train.staleness_in", path=where, expected=" or ".join(map(repr, STALENESS_IN)),
                         found=repr(train.staleness_in))
    if train.staleness_in != "rounds" and not train.staleness:
        raise InputError("train.staleness_in applies only to a fixed staleness (train.staleness >= 1)", path=where,
                         expected="train.staleness >= 1", found=f"train.staleness = {train.staleness}")
    if train.mode == "sync":
        for key in ASYNC_DEFAULTS:
            if getattr(train, key) is not None:
                raise InputError(f"train.{key} applies only to train.mode = 'async'", path=where,
                                 expected="train.mode = 'async'", found="train.mode = 'sync'",
                                 hint=f"set train.mode = 'async', or remove train.{key} "
                                      "(in sync mode, fixed staleness is train.staleness)")
        return train
    if train.staleness:
        raise InputError("train.staleness applies only to train.mode = 'sync'", path=where,
                         expected="train.staleness = 0", found=f"train.staleness = {train.staleness}",
                         hint="in async mode the bound on staleness is train.max_staleness")
    train = dataclasses.replace(train, **{k: v for k, v in ASYNC_DEFAULTS.items() if getattr(train, k) is None})
    _check_range("max_staleness", train.max_staleness, 0, where)
    _check_range("async_group", train.async_group, 1, where)
    return train


def _check_range(key: str, value: int, lowest: int, where: Any) -> None:
    if not lowest <= value <= MAX_STALENESS:
        raise InputError(f"train.{key} out of range", path=where,
                         expected=f"an integer from {lowest} to {MAX_STALENESS}", found=value)


def _keep_best(value: bool | str, train: TrainConfig, where: Any) -> bool:
    """``run.keep_best`` resolved once, at the edge: ``"auto"`` (once "when ``train.patience`` can stop training",
    when keeping the best cost a checkpoint per improving epoch) is true. A resumed run reads its recorded bool."""
    if isinstance(value, bool):
        return value
    if value != "auto":
        raise InputError("bad value for run.keep_best", path=where, expected='true, false or "auto"', found=repr(value))
    return True


def _check_run(run: RunConfig, where: Any) -> None:
    check_log_to(run.log_to, where)
    if not run.cluster:
        return
    from memtrain.cluster.address import parse_cluster

    try:
        address = parse_cluster(run.cluster, where="run.cluster")
    except InputError as exc:
        exc.path = where
        raise
    if run.exchange == "shm" and not address.local:
        raise InputError("run.exchange = \"shm\" is not shared between machines", path=where,
                         hint="on a cluster the exchange area must be on the shared filesystem: leave run.exchange "
                              "at \"auto\" (the run directory's filesystem) or name a shared directory")


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
        return cls(**{k: _convert(hints[k], v, f"{section}.{k}") for k, v in values.items()}, **fixed)
    except InputError as exc:
        exc.path = exc.path or where
        raise


def _check_type(hint: Any, value: Any, key: str, where: Any) -> None:
    if not _matches(hint, value):
        raise InputError(f"wrong type for {key}", path=where, expected=_type_name(hint), found=repr(value))


def _matches(hint: Any, value: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is tuple:  # tuple[str, ...]: a TOML array (a list or tuple from Python)
        return isinstance(value, list | tuple) and all(_matches(typing.get_args(hint)[0], item) for item in value)
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
    if typing.get_origin(hint) is tuple:
        return f"a list of {_type_name(typing.get_args(hint)[0])} values"
    args = typing.get_args(hint)
    if args:
        return " or ".join(_type_name(a) for a in args)
    return {type(None): "nothing", Path: "a path string"}.get(hint, getattr(hint, "__name__", str(hint)))


def _convert(hint: Any, value: Any, key: str) -> Any:
    if typing.get_origin(hint) is tuple:
        return tuple(value)
    if hint is Path:
        return Path(value)
    if hint is float and isinstance(value, int):
        if abs(value) > MAX_FLOAT:  # float() would raise OverflowError
            raise InputError(f"{key} out of range", expected="a finite number", found=value)
        return float(value)
    return value
