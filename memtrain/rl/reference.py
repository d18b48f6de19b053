"""A single-process reference learner built from the pieces of memtrain/rl: what the engines must reproduce.

Per version v: every slot's collection task (``collect``) publishes its shard, the shards are read back
(validated) in slot order, GAE is computed per shard, and the learner steps the flat vector with memtrain's
Adam (memtrain/train/optim.py): PPO for ``epochs`` x ``minibatches`` steps in the order from (seed, v,
epoch), or A2C for one step (each minibatch's gradient the fold of ``learner_chunks`` shares, all computed here).
The result is version v + 1. With ``staleness = 1`` version v + 1 is learned from
the shards collected with v - 1 instead (version 1 is version 0: nothing was collected before it), and one last
version learns from the last collection's shards. ``memtrain train`` (memtrain/rl/server.py) runs the same
computation with the tasks on workers, and gives the same bits (tests/test_rl_train.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from memtrain.errors import InputError
from memtrain.files import publish_array
from memtrain.layout import weights_path
from memtrain.rl.collect import EpisodeState, SlotCache, blas_controller, collect
from memtrain.rl.envs import EnvSpec, Slot, reset_seed
from memtrain.rl.learner import Learner, last_loss, learn
from memtrain.rl.policy import Policy
from memtrain.rl.ppo import PPOConfig
from memtrain.rl.trajectory import read_shard, shard_path
from memtrain.train.optim import OptimizerConfig, state_names

ALGORITHMS = ("ppo", "a2c")


@dataclass(frozen=True)
class ReferenceConfig:
    """A job of the reference loop. Defaults: CleanRL's ppo.py on CartPole-v1 (4 slots x 128 steps, lr 2.5e-4
    annealed linearly to 0, Adam eps 1e-5, ent_coef 0.01)."""

    env: EnvSpec
    algorithm: str = "ppo"
    env_steps: int = 500_000  # the budget: versions = env_steps // (slots * steps)
    slots: int = 4
    steps: int = 128
    seed: int = 1
    hidden: tuple[int, ...] = (64, 64)
    lr: float = 2.5e-4
    anneal_lr: bool = True  # lr * (1 - v / versions) at version v
    anneal_clip: bool = False  # likewise PPO's clip range (rl-zoo's CartPole set)
    adam_eps: float = 1e-5
    learner: PPOConfig = field(default_factory=lambda: PPOConfig(ent_coef=0.01))
    staleness: int = 0  # 1: version v + 1 is learned from the shards collected with v - 1 (DPPO's kept buffers)
    learner_chunks: int = 1  # each minibatch's gradient: the fold of this many shares (train.learner_chunks)

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise InputError("bad value for train.algorithm", expected=" or ".join(map(repr, ALGORITHMS)),
                             found=repr(self.algorithm))
        if self.versions < 1:
            raise InputError("train.env_steps is less than one version's steps",
                             expected=f">= env.slots * env.steps = {self.slots * self.steps}",
                             found=self.env_steps)

    @property
    def versions(self) -> int:
        return self.env_steps // (self.slots * self.steps)


@dataclass
class History:
    """Per version: the returns of the episodes that ended in it (in slot order), and the learner's last loss."""

    returns: list[np.ndarray] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def last_episodes(self, count: int) -> np.ndarray:
        every = np.concatenate(self.returns) if self.returns else np.zeros(0)
        return every[-count:]


def train(config: ReferenceConfig, run_dir: Path) -> tuple[np.ndarray, History]:
    """Run the job in ``run_dir`` (weights/ and trajectories/ are made there); the final weights and the history.

    BLAS runs on one thread, as in memtrain's workers: the same kernels, so the same bits on any machine load.
    """
    with blas_controller().limit(limits=1):
        return _train(config, run_dir)


def _train(config: ReferenceConfig, run_dir: Path) -> tuple[np.ndarray, History]:
    spaces = Slot(config.env, config.seed, 0).spaces
    policy = Policy(spaces, config.hidden)
    weights = policy.init(np.random.default_rng(np.random.SeedSequence([0x696E6974, config.seed])))
    optimizer = OptimizerConfig(name="adam", lr=config.lr, eps=config.adam_eps)
    state = {name: np.zeros_like(weights) for name in state_names(optimizer)}
    shards = Path(run_dir) / "trajectories"
    for folder in (shards, weights_path(Path(run_dir), 0).parent):
        folder.mkdir(parents=True, exist_ok=True)
    episodes = [EpisodeState.start(spaces) for _ in range(config.slots)]
    cache, history, step = SlotCache(), History(), 0
    try:
        pending: list = []  # staleness 1: the shards of the version before, learned from at this one
        for version in range(config.versions + config.staleness):
            path = weights_path(Path(run_dir), version)
            publish_array(path, weights, durable=False)
            trajectories = []
            for slot in range(config.slots if version < config.versions else 0):
                done = collect(path, version, slot, config.env, config.seed, config.steps, episodes[slot],
                               out_dir=shards, hidden=config.hidden, cache=cache)
                episodes[slot] = done.state  # the next task of the slot continues where this one left it
            for slot in range(config.slots if version < config.versions else 0):  # read back in slot order
                trajectories.append(read_shard(shard_path(shards, version, slot), spaces=spaces, version=version,
                                               slot=slot, seed=config.seed, steps=config.steps))
            if trajectories:
                history.returns.append(np.concatenate([t.episode_return[t.done] for t in trajectories]))
            learned_from = pending if config.staleness else trajectories
            if learned_from:  # staleness 1 at version 0: nothing collected before it, version 1 = version 0
                weights, state, step, loss = _learn(config, policy, weights, state, step,
                                                    version - config.staleness, learned_from)
                history.losses.append(loss)
                _retire(shards, version - config.staleness, config.slots)
            os.unlink(path)
            pending = trajectories
    finally:
        cache.close()
    return weights, history


def _learn(config: ReferenceConfig, policy: Policy, weights: np.ndarray, state: dict[str, np.ndarray], step: int,
           version: int, trajectories: list) -> tuple[np.ndarray, dict[str, np.ndarray], int, float]:
    learner = Learner(policy, OptimizerConfig(name="adam", lr=config.lr, eps=config.adam_eps), config.learner,
                      config.algorithm, config.seed, config.versions, config.anneal_lr, config.anneal_clip,
                      config.learner_chunks)
    learned = learn(learner, weights, state, step, version, trajectories)
    return learned.weights, learned.state, learned.step, last_loss(learned)


def _retire(shards: Path, version: int, slots: int) -> None:
    """Drop the version's shards once learned from (the reference keeps no history on disk)."""
    for slot in range(slots):
        os.unlink(shard_path(shards, version, slot))


def evaluate(policy: Policy, weights: np.ndarray, spec: EnvSpec, episodes: int, seed: int, *,
             greedy: bool = True) -> np.ndarray:
    """Returns of ``episodes`` fresh episodes (reset seeds from (seed, slot 0, episode)), greedy or sampled."""
    env = Slot(spec, seed, 0)
    rng = np.random.default_rng(reset_seed(seed, 1, 0))
    returns = np.zeros(episodes)
    try:
        for k in range(episodes):
            obs, ended, t = env.reset(k, version=-1), False, 0
            while not ended:
                fwd = policy.forward(weights, obs[None])
                action = policy.greedy(fwd) if greedy else policy.sample(fwd, rng)
                obs, reward, terminated, truncated = env.step(action[0], version=-1, step=t)
                returns[k] += reward
                ended, t = terminated or truncated, t + 1
    finally:
        env.close()
    return returns
