"""The learners' arithmetic: GAE, the PPO and A2C losses with their analytic gradients, the minibatch order.

Everything here is a pure function of its arguments: no I/O, no clock, no randomness but the one derived from
(seed, version, epoch). The gradient is w.r.t. the flat parameter vector (memtrain/rl/policy.py) and is checked
against finite differences in float64 (tests/test_rl_ppo.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from memtrain.errors import InputError
from memtrain.rl.policy import Policy
from memtrain.rl.trajectory import Trajectory


@dataclass(frozen=True)
class PPOConfig:
    """The learner's options. Defaults: CleanRL's ppo.py (which are rl-zoo's CartPole set but for its lr)."""

    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.2  # PPO's epsilon; ratio clipped to [1 - clip, 1 + clip]
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    epochs: int = 4  # PPO: passes over a version's batch
    minibatches: int = 4  # PPO: minibatches per epoch (the batch split as evenly as it goes)
    norm_adv: bool = True  # normalise advantages per minibatch (PPO) / per batch (A2C)
    max_grad_norm: float = 0.5  # clip the gradient's global norm before the step; 0 = never

    def __post_init__(self) -> None:
        for key, ok, expected in (("gamma", 0 <= self.gamma <= 1, "in [0, 1]"),
                                  ("gae_lambda", 0 <= self.gae_lambda <= 1, "in [0, 1]"),
                                  ("clip", self.clip > 0, "> 0"), ("vf_coef", self.vf_coef >= 0, ">= 0"),
                                  ("ent_coef", self.ent_coef >= 0, ">= 0"),
                                  ("max_grad_norm", self.max_grad_norm >= 0, ">= 0")):
            if not ok:
                raise InputError(f"bad value for train.{key}", expected=f"a number {expected}",
                                 found=repr(getattr(self, key)))
        for key in ("epochs", "minibatches"):
            if getattr(self, key) < 1:
                raise InputError(f"bad value for train.{key}", expected="an integer >= 1",
                                 found=repr(getattr(self, key)))


def gae(traj: Trajectory, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns) of one shard, float64, by generalised advantage estimation.

    delta_t = r_t + gamma * (1 - terminated_t) * next_value_t - value_t, and
    A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1}, with A_T = 0: a terminated step bootstraps nothing, a
    truncated one bootstraps from the value of its final observation (``next_value``), and the shard's last step
    from the value of the observation the slot goes on from. Returns are A + value.
    """
    rewards = np.asarray(traj.rewards, np.float64)
    value = np.asarray(traj.value, np.float64)
    next_value = np.where(traj.terminated, 0.0, np.asarray(traj.next_value, np.float64))
    delta = rewards + gamma * next_value - value
    carry = gamma * lam * ~traj.done
    advantages = np.zeros_like(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = delta[t] + carry[t] * running
        advantages[t] = running
    return advantages, advantages + value


@dataclass(frozen=True)
class Batch:
    """A version's samples, the shards concatenated in slot order (float64 advantages and returns)."""

    obs: np.ndarray
    actions: np.ndarray
    logp: np.ndarray
    value: np.ndarray
    advantages: np.ndarray
    returns: np.ndarray

    def __len__(self) -> int:
        return len(self.obs)

    def rows(self, index: np.ndarray) -> Batch:
        return Batch(*(getattr(self, name)[index] for name in
                       ("obs", "actions", "logp", "value", "advantages", "returns")))


def batch(trajectories: Sequence[Trajectory], config: PPOConfig) -> Batch:
    """The shards of one version (in slot order) as one batch, with their GAE."""
    estimates = [gae(traj, config.gamma, config.gae_lambda) for traj in trajectories]
    return Batch(np.concatenate([t.obs for t in trajectories]), np.concatenate([t.actions for t in trajectories]),
                 np.concatenate([t.logp for t in trajectories]), np.concatenate([t.value for t in trajectories]),
                 np.concatenate([a for a, _ in estimates]), np.concatenate([r for _, r in estimates]))


def minibatch_order(seed: int, version: int, epoch: int, n: int) -> np.ndarray:
    """The order of a version's ``n`` samples in epoch ``epoch``: a permutation from (seed, version, epoch) only."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([0x70706F, int(seed), int(version),
                                                                      int(epoch)])))
    return rng.permutation(n)


def minibatches(seed: int, version: int, epoch: int, n: int, count: int) -> list[np.ndarray]:
    """The row indices of each minibatch of an epoch (``count`` near-equal parts of the epoch's order)."""
    return np.array_split(minibatch_order(seed, version, epoch, n), count)


def split_bounds(n: int, count: int) -> list[tuple[int, int]]:
    """``np.array_split``'s parts of ``range(n)`` as [lo, hi) bounds (the first ``n % count`` one longer), the empty
    ones left out: the positions of an epoch's minibatches in its order, and of a minibatch's chunks."""
    size, extra = divmod(n, count)
    bounds, lo = [], 0
    for part in range(count):
        hi = lo + size + (part < extra)
        if hi > lo:
            bounds.append((lo, hi))
        lo = hi
    return bounds


@dataclass(frozen=True)
class LossResult:
    """A loss, its gradient w.r.t. the flat vector, and its parts (for metrics)."""

    loss: float
    grad: np.ndarray
    policy_loss: float
    value_loss: float
    entropy: float
    approx_kl: float = 0.0
    clip_fraction: float = 0.0


def _advantages(batch: Batch, normalize: bool, dtype: np.dtype) -> np.ndarray:
    adv = batch.advantages
    if normalize and len(adv) > 1:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    return adv.astype(dtype)


def ppo_loss(policy: Policy, flat: np.ndarray, batch: Batch, config: PPOConfig,
             part: tuple[int, int] | None = None) -> LossResult:
    """PPO's clipped surrogate + vf_coef * value loss - ent_coef * entropy, means over ``batch``'s rows.

    policy loss: mean(max(-A r, -A clip(r, 1 - eps, 1 + eps))), r = exp(logp - logp_old);
    value loss: 0.5 mean((V - returns)^2). ``part`` (lo, hi): rows [lo, hi)'s share of it (``_share``).
    """
    n, dtype = len(batch), flat.dtype
    batch, adv, mean = _share(batch, _advantages(batch, config.norm_adv, dtype), part)
    fwd = policy.forward(flat, batch.obs)
    logp = policy.log_prob(fwd, batch.actions)
    log_ratio = logp - batch.logp.astype(dtype)
    ratio = np.exp(log_ratio)
    clipped = np.clip(ratio, 1.0 - config.clip, 1.0 + config.clip)
    unclipped_term, clipped_term = -adv * ratio, -adv * clipped
    # the max's gradient: the unclipped term's where it is the larger one (where both are equal the clip is
    # inactive, so both have the unclipped term's gradient); zero where the clipped term wins
    active = unclipped_term >= clipped_term
    entropy = policy.entropy(fwd)
    diff = fwd.value - batch.returns.astype(dtype)
    d_logp = np.where(active, -adv * ratio, 0.0) / n
    d_value = config.vf_coef * diff / n
    d_entropy = np.full(len(batch), -config.ent_coef / n, dtype)
    grad = policy.gradient(flat, fwd, batch.actions, d_logp, d_entropy, d_value)
    policy_loss = float(mean(np.maximum(unclipped_term, clipped_term)))
    value_loss = float(0.5 * mean(diff * diff))
    mean_entropy = float(mean(entropy))
    return LossResult(policy_loss + config.vf_coef * value_loss - config.ent_coef * mean_entropy, grad, policy_loss,
                      value_loss, mean_entropy, approx_kl=float(mean((ratio - 1.0) - log_ratio)),
                      clip_fraction=float(mean(np.abs(ratio - 1.0) > config.clip)))


def a2c_loss(policy: Policy, flat: np.ndarray, batch: Batch, config: PPOConfig,
             part: tuple[int, int] | None = None) -> LossResult:
    """A2C: -mean(A logp) + vf_coef * 0.5 mean((V - returns)^2) - ent_coef * mean(entropy), one step per version.
    ``part`` (lo, hi): rows [lo, hi)'s share of it (``_share``)."""
    n, dtype = len(batch), flat.dtype
    batch, adv, mean = _share(batch, _advantages(batch, config.norm_adv, dtype), part)
    fwd = policy.forward(flat, batch.obs)
    logp = policy.log_prob(fwd, batch.actions)
    entropy = policy.entropy(fwd)
    diff = fwd.value - batch.returns.astype(dtype)
    grad = policy.gradient(flat, fwd, batch.actions, -adv / n, np.full(len(batch), -config.ent_coef / n, dtype),
                           config.vf_coef * diff / n)
    policy_loss = float(-mean(adv * logp))
    value_loss = float(0.5 * mean(diff * diff))
    mean_entropy = float(mean(entropy))
    return LossResult(policy_loss + config.vf_coef * value_loss - config.ent_coef * mean_entropy, grad, policy_loss,
                      value_loss, mean_entropy)


def _share(batch: Batch, adv: np.ndarray, part: tuple[int, int] | None
           ) -> tuple[Batch, np.ndarray, Callable[[np.ndarray], Any]]:
    """The rows a loss is computed on, their advantages, and its "mean". The whole batch: its rows, ``np.mean``.
    A part [lo, hi): its rows with their advantages normalised over the whole batch, and the sum over the part
    divided by the whole batch's row count (float64): the part's share, so that its gradient (each row's term
    divided by the whole count) and its loss's parts are the shares the chunks of a minibatch add up to in chunk
    order (memtrain/rl/learner.py ``fold_shares``), whoever computes them."""
    if part is None:
        return batch, adv, np.mean
    n, (lo, hi) = len(batch), part
    return batch.rows(np.arange(lo, hi)), adv[lo:hi], lambda x: np.sum(x, dtype=np.float64) / n


def clip_grad_norm(grad: np.ndarray, max_norm: float) -> np.ndarray:
    """``grad`` scaled so its global L2 norm is at most ``max_norm`` (unchanged when ``max_norm`` is 0)."""
    if max_norm <= 0:
        return grad
    norm = math.sqrt(float(np.dot(grad.astype(np.float64), grad.astype(np.float64))))
    return grad if norm <= max_norm else (grad * (max_norm / (norm + 1e-6))).astype(grad.dtype)
