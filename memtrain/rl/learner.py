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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from memtrain.files import open_regular, publish_array
from memtrain.rl.policy import Policy
from memtrain.rl.ppo import (
    Batch,
    LossResult,
    PPOConfig,
    a2c_loss,
    batch,
    clip_grad_norm,
    minibatch_order,
    ppo_loss,
    split_bounds,
)
from memtrain.rl.trajectory import Trajectory
from memtrain.train.loops.node_sum import fold
from memtrain.train.optim import OptimizerConfig, apply_update


@dataclass(frozen=True)
class Learner:
    """What a version's update needs besides its inputs: the policy, the optimizer, the learner's options.

    ``chunks``: each minibatch's gradient is the fold in chunk order of its ``chunks`` near-equal row ranges'
    shares (ppo.py ``_share``), computed by the server or by the workers as tasks (``train.learner``): the chunks
    are the job's, so the bits are the same wherever they are computed. 1: the minibatch's gradient in one piece."""

    policy: Policy
    optimizer: OptimizerConfig
    config: PPOConfig
    algorithm: str  # "ppo" | "a2c"
    seed: int
    versions: int  # the run's, for the annealing
    anneal_lr: bool = True
    anneal_clip: bool = False
    chunks: int = 1

    def config_at(self, version: int) -> tuple[PPOConfig, float]:
        """Version ``version``'s learner options and learning rate (annealed linearly to 0 over the run)."""
        frac = 1.0 - version / self.versions
        lr = self.optimizer.lr * frac if self.anneal_lr else self.optimizer.lr
        config = replace(self.config, clip=max(self.config.clip * frac, 1e-8)) if self.anneal_clip else self.config
        return config, lr

    def epochs(self) -> int:
        return 1 if self.algorithm == "a2c" else self.config.epochs

    def order(self, version: int, epoch: int, n: int) -> np.ndarray:
        """The rows of a version's batch in epoch ``epoch``'s order (A2C: as they are)."""
        return np.arange(n) if self.algorithm == "a2c" else minibatch_order(self.seed, version, epoch, n)

    def minibatch_bounds(self, n: int) -> list[tuple[int, int]]:
        """Each minibatch's positions [lo, hi) in an epoch's order (A2C: the whole batch)."""
        return split_bounds(n, 1 if self.algorithm == "a2c" else self.config.minibatches)

    def share(self, weights: np.ndarray, minibatch: Batch, chunk: int, config: PPOConfig) -> LossResult:
        """Chunk ``chunk``'s share of ``minibatch``'s loss and gradient at ``weights`` (the whole of it with one
        chunk): what the server or a worker computes for one chunk."""
        loss_of = a2c_loss if self.algorithm == "a2c" else ppo_loss
        if self.chunks == 1:
            return loss_of(self.policy, weights, minibatch, config)
        return loss_of(self.policy, weights, minibatch, config, split_bounds(len(minibatch), self.chunks)[chunk])

    def chunk_count(self, rows: int) -> int:
        return len(split_bounds(rows, self.chunks))


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


@dataclass(frozen=True)
class Minibatch:
    """One optimizer step's gradient request: step ``step`` (1-based, the run's count) at ``weights``, on positions
    [lo, hi) of epoch ``epoch``'s order of version ``version``'s batch, whose rows are ``rows``."""

    step: int
    version: int
    epoch: int
    lo: int
    hi: int
    weights: np.ndarray
    rows: Batch
    config: PPOConfig


# A minibatch -> its chunks' shares, in chunk order: the server's own (``in_server``) or the workers' (server.py)
Shares = Callable[[Minibatch], list[LossResult]]


def in_server(learner: Learner) -> Shares:
    def shares(minibatch: Minibatch) -> list[LossResult]:
        return [learner.share(minibatch.weights, minibatch.rows, chunk, minibatch.config)
                for chunk in range(learner.chunk_count(len(minibatch.rows)))]
    return shares


def fold_shares(shares: list[LossResult]) -> LossResult:
    """A minibatch's loss from its chunks' shares: the gradients folded in chunk order (train/loops/node_sum.py
    ``fold``: the supervised rounds' order), the loss's parts added in the same order."""
    if len(shares) == 1:
        return shares[0]
    grad = np.empty_like(shares[0].grad)
    fold(grad, [s.grad for s in shares], continued=False)
    total = {key: 0.0 for key in ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")}
    for share in shares:
        for key in total:
            total[key] += getattr(share, key)
    return LossResult(grad=grad, **total)


def learn(learner: Learner, weights: np.ndarray, state: dict[str, np.ndarray], step: int, version: int,
          trajectories: Sequence[Trajectory], shares: Shares | None = None) -> Learned:
    """Version ``version``'s update from its shards (slot order); ``step``: optimizer steps taken before it.
    ``shares``: who computes each minibatch's chunks (default: this process)."""
    config, lr = learner.config_at(version)
    data = batch(trajectories, config)
    shares = shares or in_server(learner)
    results: list[LossResult] = []
    for epoch in range(learner.epochs()):
        order = learner.order(version, epoch, len(data))
        for lo, hi in learner.minibatch_bounds(len(data)):
            result = fold_shares(shares(Minibatch(step + 1, version, epoch, lo, hi, weights,
                                                  data.rows(order[lo:hi]), config)))
            grad = clip_grad_norm(result.grad, config.max_grad_norm)
            step += 1
            new_weights, new_state = np.empty_like(weights), {k: np.empty_like(v) for k, v in state.items()}
            apply_update(learner.optimizer, step, lr, weights, grad, state, new_weights, new_state)
            weights, state = new_weights, new_state
            results.append(result)
    return Learned(weights, state, step, results, data, lr)


# a share's loss parts, after its gradient in a worker's file (float64: the float32 gradient exactly, and the parts)
SHARE_PARTS = ("loss", "policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
BATCH_FIELDS = ("obs", "actions", "logp", "value", "advantages", "returns")


def write_step(path: Path, weights: np.ndarray, rows: Batch) -> None:
    """One optimizer step's inputs for the workers: the weights and the minibatch's rows, one structured record
    published whole (temporary name, then rename)."""
    arrays = {"weights": weights} | {name: getattr(rows, name) for name in BATCH_FIELDS}
    record = np.zeros((), dtype=[(name, a.dtype, a.shape) for name, a in arrays.items()])
    for name, array in arrays.items():
        record[name] = array
    publish_array(path, record, durable=False)


def read_step(path: Path) -> tuple[np.ndarray, Batch]:
    """``write_step``'s weights and rows (never unpickled)."""
    with open_regular(path, what="a learner step's inputs") as handle:
        record = np.lib.format.read_array(handle, allow_pickle=False)
    return np.array(record["weights"]), Batch(*(np.array(record[name]) for name in BATCH_FIELDS))


def last_loss(learned: Learned) -> float:
    return learned.steps[-1].loss if learned.steps else math.nan
