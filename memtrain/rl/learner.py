"""The learner: a version's shards -> the next version's weights, with memtrain's optimizer (train/optim.py).

PPO: ``epochs`` passes over the version's batch, each in ``minibatches`` parts in the order from (seed, version,
epoch) (memtrain/rl/ppo.py ``minibatches``), one optimizer step per part; A2C: one step on the whole batch. The
learning rate (and with ``anneal_clip`` the clip range) is annealed linearly to 0 over the run's versions
when ``anneal_lr`` says so. Every gradient's global norm is clipped to ``max_grad_norm`` first.

One function, used by ``memtrain train`` (memtrain/rl/server.py) and by the single-process reference loop
(memtrain/rl/reference.py): the same arithmetic in the same order, hence the same bits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from memtrain.rl.policy import Policy
from memtrain.rl.ppo import Batch, LossResult, PPOConfig, a2c_loss, batch, clip_grad_norm, minibatches, ppo_loss
from memtrain.rl.trajectory import Trajectory
from memtrain.train.optim import OptimizerConfig, apply_update


@dataclass(frozen=True)
class Learner:
    """What a version's update needs besides its inputs: the policy, the optimizer, the learner's options."""

    policy: Policy
    optimizer: OptimizerConfig
    config: PPOConfig
    algorithm: str  # "ppo" | "a2c"
    seed: int
    versions: int  # the run's, for the annealing
    anneal_lr: bool = True
    anneal_clip: bool = False


@dataclass(frozen=True)
class Learned:
    """An update's result: the next weights and optimizer state, the optimizer's step count after it, the loss of
    each minibatch step (for the metrics) and the batch it learned from."""

    weights: np.ndarray
    state: dict[str, np.ndarray]
    step: int
    steps: list[LossResult]
    batch: Batch
    lr: float


def learn(learner: Learner, weights: np.ndarray, state: dict[str, np.ndarray], step: int, version: int,
          trajectories: Sequence[Trajectory]) -> Learned:
    """Version ``version``'s update from its shards (slot order); ``step``: optimizer steps taken before it."""
    frac = 1.0 - version / learner.versions
    lr = learner.optimizer.lr * frac if learner.anneal_lr else learner.optimizer.lr
    config = learner.config
    if learner.anneal_clip:
        config = replace(config, clip=max(config.clip * frac, 1e-8))
    data = batch(trajectories, config)
    if learner.algorithm == "a2c":
        groups = [[np.arange(len(data))]]
    else:
        groups = [minibatches(learner.seed, version, epoch, len(data), config.minibatches)
                  for epoch in range(config.epochs)]
    loss_of = a2c_loss if learner.algorithm == "a2c" else ppo_loss
    results: list[LossResult] = []
    for parts in groups:
        for rows in parts:
            result = loss_of(learner.policy, weights, data.rows(rows), config)
            grad = clip_grad_norm(result.grad, config.max_grad_norm)
            step += 1
            new_weights, new_state = np.empty_like(weights), {k: np.empty_like(v) for k, v in state.items()}
            apply_update(learner.optimizer, step, lr, weights, grad, state, new_weights, new_state)
            weights, state = new_weights, new_state
            results.append(result)
    return Learned(weights, state, step, results, data, lr)


def last_loss(learned: Learned) -> float:
    return learned.steps[-1].loss if learned.steps else math.nan
