"""Environments: a job's ``[env]`` spec resolved to a checked gymnasium environment, and one seeded slot.

An environment is named by a gymnasium id (``id = "CartPole-v1"``) or by a factory (``factory =
"mymodule:make_env"``, a callable of no arguments returning an object with the gymnasium API). Every
failure to get a usable environment is an ``InputError`` saying what was asked for and what was found.

Seeding rule: episode ``k`` of slot ``e`` starts with ``reset(seed=reset_seed(seed, e, k))``. The reset seed
is a function of (job seed, slot, episode index) only, never of a worker, a process or the time, so an
episode is a pure function of that triple and the actions taken in it: which is what lets a slot be
re-simulated after a crash (memtrain/rl/collect.py).
"""

from __future__ import annotations

import difflib
import importlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from memtrain.errors import InputError, WorkerFailure

DISCRETE, CONTINUOUS = "discrete", "continuous"


@dataclass(frozen=True)
class EnvSpec:
    """What the job's ``[env]`` table names: exactly one of ``id`` (gymnasium) and ``factory`` (``module:callable``)."""

    id: str | None = None
    factory: str | None = None

    def __post_init__(self) -> None:
        if (self.id is None) == (self.factory is None):
            raise InputError("[env] needs exactly one of `id` and `factory`",
                             expected='id = "CartPole-v1" or factory = "mymodule:make_env"',
                             found=f"id {self.id!r}, factory {self.factory!r}")
        for key, value in (("id", self.id), ("factory", self.factory)):
            if value is not None and (not isinstance(value, str) or not value):
                raise InputError(f"bad value for env.{key}", expected="a non-empty string", found=repr(value))

    def __str__(self) -> str:
        return f"id {self.id!r}" if self.id is not None else f"factory {self.factory!r}"


@dataclass(frozen=True)
class Spaces:
    """What the policy needs to know of an environment's spaces.

    ``obs_dim``: the length of the (flat Box) observation. ``kind``: DISCRETE (``n`` actions, numbered from
    ``start`` in the environment, from 0 in memtrain) or CONTINUOUS (``n`` = the Box's length; actions are
    clipped to ``low``/``high`` before they reach the environment, and recorded unclipped).
    """

    obs_dim: int
    kind: str
    n: int
    start: int = 0
    low: tuple[float, ...] = ()
    high: tuple[float, ...] = ()

    def __str__(self) -> str:
        return f"{self.obs_dim} observations, {self.n} {'actions' if self.kind == DISCRETE else 'action dimensions'}"

    def env_action(self, action: np.ndarray) -> Any:
        """The action as the environment takes it, from the action as memtrain records it (a pure function)."""
        if self.kind == DISCRETE:
            return int(action) + self.start
        return np.clip(action, np.asarray(self.low, np.float32), np.asarray(self.high, np.float32))


def _gymnasium() -> Any:
    try:
        return importlib.import_module("gymnasium")
    except ImportError as exc:
        raise InputError("reinforcement learning needs gymnasium, which is not installed",
                         hint='pip install "memtrain[rl]"') from exc


def make_env(spec: EnvSpec) -> Any:
    """A new environment for ``spec``, its API and spaces checked (``check_spaces``)."""
    env = _from_id(spec.id) if spec.id is not None else _from_factory(spec.factory)
    check_spaces(env, spec)
    return env


def _from_id(env_id: str) -> Any:
    gym = _gymnasium()
    if env_id not in gym.registry:
        close = _close_names(env_id, list(gym.registry))
        raise InputError("unknown environment id in env.id", expected="a registered gymnasium id",
                         found=repr(env_id),
                         hint=(f"did you mean {' or '.join(repr(c) for c in close)}?" if close else
                               "see gymnasium.pprint_registry() for the ids; or name a factory with "
                               'env.factory = "mymodule:make_env"'))
    try:
        return gym.make(env_id, disable_env_checker=True)
    except gym.error.DependencyNotInstalled as exc:
        raise InputError(f"environment {env_id!r} needs a package that is not installed", found=str(exc)) from exc
    except Exception as exc:  # an environment's constructor is user code: any failure is the job's
        raise InputError(f"environment {env_id!r} could not be made", found=f"{type(exc).__name__}: {exc}") from exc


def _close_names(word: str, names: list[str]) -> list[str]:
    """Up to three registered ids close to ``word``, case-insensitively."""
    lowered = {name.lower(): name for name in names}
    return [lowered[c] for c in difflib.get_close_matches(word.lower(), list(lowered), n=3, cutoff=0.6)]


def _from_factory(factory: str) -> Any:
    module_name, sep, attr = factory.partition(":")
    if not sep or not module_name or not attr:
        raise InputError("bad value for env.factory", expected='"module:callable", e.g. "mymodule:make_env"',
                         found=repr(factory))
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise InputError(f"env.factory: cannot import module {module_name!r}", found=f"{type(exc).__name__}: {exc}",
                         hint="the module must be importable by the workers too (installed, or on PYTHONPATH)") from exc
    make = getattr(module, attr, None)
    if make is None:
        close = difflib.get_close_matches(attr, [n for n in dir(module) if not n.startswith("_")], n=1)
        raise InputError(f"env.factory: module {module_name!r} has no attribute {attr!r}",
                         hint=f"did you mean `{close[0]}`?" if close else None)
    if not callable(make):
        raise InputError(f"env.factory: {factory!r} is not callable", expected="a function returning an environment",
                         found=type(make).__name__)
    try:
        return make()
    except Exception as exc:
        raise InputError(f"env.factory: {factory!r} raised while making the environment",
                         found=f"{type(exc).__name__}: {exc}") from exc


def check_spaces(env: Any, spec: EnvSpec) -> Spaces:
    """The environment's ``Spaces``, or an InputError saying what does not fit (the API, the spaces)."""
    gym = _gymnasium()
    missing = [name for name in ("reset", "step", "observation_space", "action_space") if not hasattr(env, name)]
    if missing:
        raise InputError(f"env {spec} did not give an environment with the gymnasium API",
                         expected="reset(), step(), observation_space and action_space",
                         found=f"{type(env).__name__} without {', '.join(missing)}")
    obs, act = env.observation_space, env.action_space
    box, discrete = gym.spaces.Box, gym.spaces.Discrete
    if not isinstance(obs, box) or len(obs.shape) != 1:
        raise InputError(f"env {spec}: the policy cannot take this observation space",
                         expected="a flat Box (one dimension)", found=repr(obs),
                         hint="wrap the environment in gymnasium.wrappers.FlattenObservation in a factory")
    if isinstance(act, discrete):
        return Spaces(obs_dim=int(obs.shape[0]), kind=DISCRETE, n=int(act.n), start=int(act.start))
    if isinstance(act, box) and len(act.shape) == 1 and np.issubdtype(act.dtype, np.floating):
        low, high = np.asarray(act.low, np.float64), np.asarray(act.high, np.float64)
        return Spaces(obs_dim=int(obs.shape[0]), kind=CONTINUOUS, n=int(act.shape[0]),
                      low=tuple(map(float, low)), high=tuple(map(float, high)))
    raise InputError(f"env {spec}: unsupported action space", expected="Discrete, or a flat float Box",
                     found=repr(act))


def reset_seed(seed: int, slot: int, episode: int) -> int:
    """The seed of episode ``episode`` of slot ``slot`` (a 63-bit int from numpy's SeedSequence of the triple)."""
    words = np.random.SeedSequence([0x656E76, int(seed), int(slot), int(episode)]).generate_state(2, np.uint32)
    return int(words[0]) | (int(words[1] & 0x7FFFFFFF) << 32)


class Slot:
    """One environment copy of a job: seeded resets, observations as float32, failures named.

    ``version`` only names the collection task in error messages; the slot's behaviour never depends on it.
    """

    def __init__(self, spec: EnvSpec, seed: int, slot: int):
        self.spec, self.seed, self.slot = spec, int(seed), int(slot)
        self.env = make_env(spec)
        self.spaces = check_spaces(self.env, spec)
        self.episode = -1  # none started yet

    def reset(self, episode: int, *, version: int, seed: int | None = None) -> np.ndarray:
        """The first observation of episode ``episode`` (its seeded reset; ``seed``: another reset seed, for the
        evaluation episodes, which are kept apart from training's)."""
        self.episode = int(episode)
        chosen = reset_seed(self.seed, self.slot, episode) if seed is None else int(seed)
        obs = self._call("reset", version, 0, lambda: self.env.reset(seed=chosen))
        return self._observation(obs[0], version, 0)

    def step(self, action: np.ndarray, *, version: int, step: int) -> tuple[np.ndarray, float, bool, bool]:
        """(observation, reward, terminated, truncated) after ``action``; ``step``: the step in the episode."""
        env_action = self.spaces.env_action(action)
        obs, reward, terminated, truncated, _ = self._call("step", version, step, lambda: self.env.step(env_action))
        reward = float(reward)
        if not math.isfinite(reward):
            raise self._failure("step", version, step, f"a non-finite reward {reward}")
        return self._observation(obs, version, step), reward, bool(terminated), bool(truncated)

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if close is not None:
            close()

    def _call(self, what: str, version: int, step: int, call: Any) -> Any:
        try:
            return call()
        except Exception as exc:
            raise self._failure(what, version, step, f"{type(exc).__name__}: {exc}") from exc

    def _observation(self, obs: Any, version: int, step: int) -> np.ndarray:
        array = np.asarray(obs, dtype=np.float32)
        if array.shape != (self.spaces.obs_dim,):
            raise self._failure("observation", version, step,
                                f"an observation of shape {array.shape}, not ({self.spaces.obs_dim},)")
        if not np.isfinite(array).all():  # the policy would turn it into NaN logits and a meaningless action
            raise self._failure("observation", version, step, f"a non-finite observation {array.tolist()}")
        return array

    def _failure(self, what: str, version: int, step: int, found: str) -> WorkerFailure:
        return WorkerFailure(f"the environment failed in {what}", where=self.where(version, step), found=found,
                             hint=f"env {self.spec}")

    def where(self, version: int, step: int) -> str:
        """Where a failure happened: the collection task, the slot's seed and the step of the episode."""
        return f"version {version}, slot {self.slot}, seed {self.seed}, episode {self.episode}, step {step}"
