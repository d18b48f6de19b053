"""A reinforcement-learning job: ``[env]`` + ``[model]`` + ``[train]`` + ``[run]`` -> a validated, frozen ``RLJob``.

The job file of issue 40 (docs/rl.md): ``[env]`` names the environment and fixes the batch of a version
(``slots`` x ``steps``, never the worker count); ``[train]`` holds ``algorithm``, the budget ``env_steps`` and
the learner's keys next to the keys every job has (seed, workers, timeouts, the optimizer). Everything is checked
once, here, the way memtrain/config.py checks a supervised job: unknown keys, wrong types and values out of range
(``RL_RANGES``) are ``InputError``s naming the file, the key, what was expected and what was found; the
environment is made once and its spaces checked (memtrain/rl/envs.py), so an unknown id, a factory that is not an
environment or an observation space the policy cannot take stops the job before anything is written.

``memtrain train`` runs these jobs (memtrain/rl/server.py); ``load_job``, the supervised reader, refuses a file with
``[env]`` naming ``memtrain train``. ``load_rl_job`` and ``rl_job_from_dict`` are the parser.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrain import config as base_config
from memtrain.config import (
    MAX_ATTEMPTS,
    MAX_EPOCHS,
    MAX_ROWS,
    MAX_SEED,
    MAX_STALENESS,
    MAX_TASKS,
    RunConfig,
    TrainConfig,
    _build,
    _check_run,
    _integers,
    _positive_finite,
    _read_toml,
)
from memtrain.errors import InputError, did_you_mean
from memtrain.models.registry import code_on_path, import_path
from memtrain.rl.envs import EnvSpec, Spaces, check_spaces, make_env

ALGORITHMS = ("ppo", "a2c")
LEARNERS = ("server", "workers")  # train.learner: where the update's minibatch gradients are computed
MAX_SLOTS = 4096  # environment copies: each is a collection task per version with its own shard file
MAX_STEPS = 10**6  # steps per slot per version (one shard holds them)


def _unit_interval() -> tuple[str, typing.Callable[[Any], bool]]:
    return "a number from 0 to 1", lambda v: isinstance(v, int | float) and 0 <= v <= 1


def _non_negative() -> tuple[str, typing.Callable[[Any], bool]]:
    return "a finite number >= 0", lambda v: isinstance(v, int | float) and math.isfinite(v) and v >= 0


# The range of every numeric value of an RL job's own keys (the keys it shares with a supervised job are checked
# by memtrain/config.py's RANGES).
RL_RANGES: dict[str, tuple[str, typing.Callable[[Any], bool]]] = {
    "env.slots": _integers(1, MAX_SLOTS),
    "env.steps": _integers(1, MAX_STEPS),
    "train.env_steps": _integers(1, MAX_ROWS),
    "train.gamma": _unit_interval(),
    "train.gae_lambda": _unit_interval(),
    "train.clip": _positive_finite("ratio"),
    "train.vf_coef": _non_negative(),
    "train.ent_coef": _non_negative(),
    "train.max_grad_norm": _non_negative(),
    "train.epochs": _integers(1, MAX_EPOCHS),
    "train.minibatches": _integers(1, MAX_TASKS),
    "train.learner_chunks": _integers(1, MAX_TASKS),
    "train.max_policy_lag": _integers(0, MAX_STALENESS),
    "train.eval_every": _integers(0, MAX_EPOCHS),
    "train.eval_episodes": _integers(1, MAX_ATTEMPTS),
    "train.eval_seed": _integers(0, MAX_SEED),
}


def check_rl_ranges(config: Any, section: str) -> None:
    """InputError for the first value of ``config`` outside its range in RL_RANGES (the one check every maker
    goes through: a job file, ``--set`` or Python code)."""
    for field_ in dataclasses.fields(config):
        key, value = f"{section}.{field_.name}", getattr(config, field_.name)
        if key not in RL_RANGES or value is None:
            continue
        expected, holds = RL_RANGES[key]
        if isinstance(value, bool) or not holds(value):
            raise InputError(f"{key} out of range", expected=expected, found=repr(value))


@dataclass(frozen=True)
class EnvConfig:
    """``[env]``: exactly one of ``id`` (a gymnasium id) and ``factory`` (``"module:callable"``, imported with
    ``code_dir`` -- the job file's directory by default -- first on the path); ``slots`` x ``steps`` per version."""

    id: str | None = None
    factory: str | None = None
    slots: int = 8
    steps: int = 128
    code_dir: str | None = None

    def __post_init__(self) -> None:
        check_rl_ranges(self, "env")
        if self.factory is not None:
            import_path(self.factory, "env.factory", example="'myenv:make_env'")
        self.spec  # noqa: B018 - exactly one name, each a non-empty string (EnvSpec's check)

    @property
    def spec(self) -> EnvSpec:
        return EnvSpec(id=self.id, factory=self.factory)


@dataclass(frozen=True)
class RLConfig:
    """The RL keys of ``[train]``. Defaults: CleanRL's ppo.py (docs/rl.md)."""

    algorithm: str = "ppo"  # "ppo" | "a2c"
    env_steps: int = 500_000  # the budget: versions = env_steps // (slots * steps)
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2  # PPO: the ratio clipped to [1 - clip, 1 + clip]
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    epochs: int = 4  # PPO: passes over a version's batch (A2C: one step per version)
    minibatches: int = 4  # PPO: minibatches per epoch
    norm_adv: bool = True
    max_grad_norm: float = 0.5  # 0: never clipped
    anneal_lr: bool = True  # lr * (1 - v / versions) at version v
    anneal_clip: bool = False  # likewise the clip range
    max_policy_lag: int | None = None  # train.mode = "async" only (default 4): an older shard is collected again
    eval_every: int = 10  # versions between evaluations of the greedy policy; 0: never
    eval_episodes: int = 10
    eval_seed: int | None = None  # the evaluation episodes' seed; default: one derived from train.seed, apart
    learner: str = "server"  # who computes the update's minibatch gradients: "server" or "workers" (docs/rl.md)
    learner_chunks: int = 1  # each minibatch's gradient is the fold of this many row ranges' shares, in order

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise InputError("bad value for train.algorithm", expected=" or ".join(map(repr, ALGORITHMS)),
                             found=repr(self.algorithm), hint=did_you_mean(self.algorithm, ALGORITHMS))
        if self.learner not in LEARNERS:
            raise InputError("bad value for train.learner", expected=" or ".join(map(repr, LEARNERS)),
                             found=repr(self.learner), hint=did_you_mean(str(self.learner), LEARNERS))
        check_rl_ranges(self, "train")


RL_TRAIN_KEYS = tuple(f.name for f in dataclasses.fields(RLConfig))
# the keys of a supervised [train] an RL job also takes; every other one (batch_size, shuffle, monitor, ...) means
# nothing here and is refused rather than ignored
SHARED_TRAIN_KEYS = ("seed", "workers", "blas_threads", "server_threads", "task_timeout", "max_attempts", "mode",
                     "staleness", *base_config.OPTIMIZER_KEYS, *base_config.OPTIMIZER_RENAMES)
RL_OPTIMIZER_DEFAULTS = {"optimizer": "adam", "lr": 2.5e-4, "eps": 1e-5}  # CleanRL's Adam
MODEL_KINDS = ("mlp", "torch")
# run.checkpoint_every counts versions in an RL job (a version takes a fraction of a second on classic control,
# a checkpoint with its fsyncs about 0.1 s): every 10 unless the job says
RL_CHECKPOINT_EVERY = 10


@dataclass(frozen=True)
class RLJob:
    env: EnvConfig
    model: base_config.ModelConfig
    train: TrainConfig  # the shared keys (seed, workers, mode, staleness, the optimizer ...)
    rl: RLConfig
    run: RunConfig
    spaces: Spaces
    source: Path | None = None
    default_dir: bool = False

    @property
    def versions(self) -> int:
        return self.rl.env_steps // (self.env.slots * self.env.steps)


def load_rl_job(path: str | os.PathLike[str], overrides: typing.Sequence[str] = (), *,
                values: typing.Mapping[str, Any] | None = None) -> RLJob:
    """Read an RL job file, apply ``--set``-style ``overrides`` and ``values`` and validate it (see the module)."""
    path = Path(path)
    raw = _read_toml(path)
    base_config._apply_overrides(raw, overrides, values, None)
    default_dir = "dir" not in raw.get("run", {})
    raw.setdefault("run", {}).setdefault("dir", str(Path("runs") / path.stem))
    job = rl_job_from_dict(raw, base=path.resolve().parent, source=path)
    return dataclasses.replace(job, default_dir=default_dir)


def rl_job_from_dict(raw: dict[str, Any], *, base: Path, source: Path | None = None,
                     where: Path | str | None = None) -> RLJob:
    """Validate an RL job given as nested dicts; errors name ``where`` (else ``source``, else ``job``)."""
    where = where or source or "job"
    sections = ("env", "model", "train", "run")
    for name, value in raw.items():
        if name == "data":
            raise InputError("a reinforcement-learning job takes no [data]: its experience comes from [env]",
                             path=where, expected="[env], [model], [train], [run]", found="[data]",
                             hint="remove [data], or remove [env] for a supervised job")
        if name not in sections:
            raise InputError(f"unknown section [{name}]", path=where,
                             expected=f"one of {', '.join(f'[{s}]' for s in sections)}",
                             hint=did_you_mean(name, sections))
        if not isinstance(value, dict):
            raise InputError(f"'{name}' must be a table [{name}]", path=where, found=type(value).__name__)
    env = _env_config(raw.get("env", {}), base, where)
    model = _model(raw.get("model", {}), base, where)
    train, rl = _train(raw.get("train", {}), where)
    run = _build(RunConfig, {"checkpoint_every": RL_CHECKPOINT_EVERY, **raw.get("run", {})}, "run", where)
    _check_run(run, where)
    run = dataclasses.replace(run, dir=(base / run.dir).resolve(), keep_best=run.keep_best is not False)
    if rl.env_steps < env.slots * env.steps:
        raise InputError("train.env_steps is less than one version's steps", path=where,
                         expected=f">= env.slots * env.steps = {env.slots * env.steps}", found=rl.env_steps)
    spaces = check_environment(env, model, where)
    return RLJob(env, model, train, rl, run, spaces, source.resolve() if source else None)


def _env_config(values: dict[str, Any], base: Path, where: Any) -> EnvConfig:
    values = dict(values)
    if "code_dir" in values and not isinstance(values["code_dir"], str):
        raise InputError("wrong type for env.code_dir", path=where, expected="a path string",
                         found=repr(values["code_dir"]))
    if "factory" in values:
        values["code_dir"] = str((base / values.get("code_dir", ".")).resolve())
    return _build(EnvConfig, values, "env", where)


def _model(values: dict[str, Any], base: Path, where: Any) -> base_config.ModelConfig:
    values = dict(values)
    kind = values.pop("kind", "mlp")
    if kind not in MODEL_KINDS:
        raise InputError("bad value for model.kind in a reinforcement-learning job", path=where,
                         expected=" or ".join(map(repr, MODEL_KINDS)), found=repr(kind),
                         hint=did_you_mean(str(kind), MODEL_KINDS))
    allowed = {"mlp": ("hidden",), "torch": ("factory", "code_dir")}[kind]
    unknown = sorted(set(values) - set(allowed))
    if kind == "mlp":
        hidden = values.setdefault("hidden", [64, 64])
        if not (isinstance(hidden, list | tuple) and hidden and all(
                isinstance(h, int) and not isinstance(h, bool) and 1 <= h <= 2**20 for h in hidden)):
            raise InputError("bad value for model.hidden", path=where,
                             expected="a non-empty list of layer widths from 1 to 1048576", found=repr(hidden))
        values["hidden"] = tuple(hidden)
    elif unknown:  # a torch factory's other keys are its keyword arguments
        unknown = []
    if unknown:
        raise InputError(f"unknown key model.{unknown[0]}", path=where, expected=f"one of {', '.join(allowed)}",
                         hint=did_you_mean(unknown[0], allowed))
    if kind == "torch":
        factory = values.get("factory")
        if not isinstance(factory, str):
            raise InputError("model.factory is needed for kind = 'torch'", path=where,
                             expected="'module:callable' returning a torch.nn.Module actor-critic",
                             found=repr(factory))
        import_path(factory, "model.factory")
        code_dir = values.get("code_dir", ".")
        if not isinstance(code_dir, str):
            raise InputError("wrong type for model.code_dir", path=where, expected="a path string",
                             found=repr(code_dir))
        values["code_dir"] = str((base / code_dir).resolve())
    return base_config.ModelConfig(kind, values)


def _train(values: dict[str, Any], where: Any) -> tuple[TrainConfig, RLConfig]:
    rl_values = {k: v for k, v in values.items() if k in RL_TRAIN_KEYS}
    shared = {k: v for k, v in values.items() if k not in RL_TRAIN_KEYS}
    for key in shared:
        if key not in SHARED_TRAIN_KEYS:
            known = sorted(set(RL_TRAIN_KEYS) | set(SHARED_TRAIN_KEYS) - {"name"})
            applies = key in {f.name for f in dataclasses.fields(TrainConfig)}
            what = f"train.{key} does not apply to" if applies else f"unknown key train.{key} in"
            raise InputError(f"{what} a reinforcement-learning job", path=where, expected=f"one of {', '.join(known)}",
                             hint=did_you_mean(key, known))
    for key, value in RL_OPTIMIZER_DEFAULTS.items():
        shared.setdefault(key, value)
    train = base_config._train_config(shared, where)
    rl = _build(RLConfig, rl_values, "train", where)
    if train.mode == "sync" and rl.max_policy_lag is not None:
        raise InputError("train.max_policy_lag applies only to train.mode = 'async'", path=where,
                         expected="train.mode = 'async'", found="train.mode = 'sync'",
                         hint="in sync mode the policy lag is train.staleness (0 or 1)")
    if train.mode == "async" and rl.max_policy_lag is None:
        rl = dataclasses.replace(rl, max_policy_lag=base_config.ASYNC_DEFAULTS["max_staleness"])
    if rl.learner == "workers" and (train.mode != "sync" or train.staleness):
        raise InputError("train.learner = 'workers' applies to train.mode = 'sync' with train.staleness = 0",
                         path=where, found=f"train.mode = {train.mode!r}, train.staleness = {train.staleness}",
                         hint="staleness 1 learns beside the collection, and async mode (A3C) learns per shard: "
                              "their learner is the server's (train.learner = 'server')")
    if train.staleness > 1:
        raise InputError("train.staleness out of range for a reinforcement-learning job", path=where,
                         expected="0 (collect with v, learn, publish v+1) or 1 (collect with v while learning "
                                  "from v-1's shards)", found=train.staleness)
    return train, rl


def check_environment(env: EnvConfig, model: base_config.ModelConfig, where: Any) -> Spaces:
    """Make the environment once and check its spaces fit the policy: the job's spaces, or an InputError."""
    with code_on_path(env.code_dir):
        try:
            made = make_env(env.spec)
        except InputError as exc:
            exc.path = exc.path or where
            raise
    try:
        return check_spaces(made, env.spec)
    finally:
        close = getattr(made, "close", None)
        if close is not None:
            close()
