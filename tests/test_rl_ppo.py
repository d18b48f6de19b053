"""memtrain/rl/ppo.py: GAE's bootstrapping rule, the PPO and A2C gradients against finite differences, the order."""

from __future__ import annotations

import numpy as np
import pytest

from memtrain.errors import InputError
from memtrain.rl.envs import CONTINUOUS, DISCRETE, Spaces
from memtrain.rl.policy import Policy
from memtrain.rl.ppo import Batch, PPOConfig, a2c_loss, batch, clip_grad_norm, gae, minibatches, ppo_loss
from memtrain.rl.trajectory import Trajectory


def _traj(rewards: list[float], value: list[float], next_value: list[float], terminated: list[bool],
          truncated: list[bool]) -> Trajectory:
    t = len(rewards)
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    return Trajectory(version=0, slot=0, seed=0, episode=0, step=0, obs=np.zeros((t, 1), np.float32),
                      actions=np.zeros(t, np.int64), rewards=np.asarray(rewards, np.float64),
                      terminated=np.asarray(terminated), truncated=np.asarray(truncated), logp=f32(np.zeros(t)),
                      value=f32(value), next_obs=np.zeros((t, 1), np.float32), next_value=f32(next_value),
                      episode_return=np.zeros(t))


def test_gae_bootstraps_on_truncation_and_at_the_end_never_on_termination() -> None:
    # steps: 0 1 [terminated] | 2 [truncated] | 3 4 (the shard ends mid-episode)
    traj = _traj(rewards=[1, 2, 3, 4, 5], value=[10, 20, 30, 40, 50], next_value=[20, 99, 77, 50, 60],
                 terminated=[False, True, False, False, False], truncated=[False, False, True, False, False])
    g, lam = 0.5, 0.5
    adv, ret = gae(traj, g, lam)
    d = [1 + g * 20 - 10, 2 - 20, 3 + g * 77 - 30, 4 + g * 50 - 40, 5 + g * 60 - 50]  # 99 is never used
    expected = [d[0] + g * lam * d[1], d[1], d[2], d[3] + g * lam * d[4], d[4]]
    assert np.allclose(adv, expected, rtol=0, atol=1e-12)
    assert np.allclose(ret, np.array(expected) + [10, 20, 30, 40, 50])
    assert adv.dtype == np.float64


def test_gae_with_lambda_one_is_the_discounted_return_minus_the_value() -> None:
    rng = np.random.default_rng(0)
    rewards, value, next_value = rng.standard_normal((3, 8))
    next_value[:-1] = value[1:]  # within an episode the next value is the next step's value
    truncated = np.zeros(8, bool)
    truncated[-1] = True
    adv, ret = gae(_traj(rewards, value, next_value, [False] * 8, truncated), 0.9, 1.0)
    v32 = np.float32(value).astype(np.float64)
    discounted = sum(0.9 ** k * rewards[k] for k in range(8)) + 0.9 ** 8 * np.float32(next_value[-1])
    assert np.isclose(ret[0], discounted) and np.isclose(adv[0], discounted - v32[0])


SPACES = {"categorical": Spaces(obs_dim=3, kind=DISCRETE, n=3),
          "gaussian": Spaces(obs_dim=3, kind=CONTINUOUS, n=2, low=(-1.0, -1.0), high=(1.0, 1.0))}


def _problem(kind: str, rows: int = 24) -> tuple[Policy, np.ndarray, Batch]:
    policy = Policy(SPACES[kind], hidden=(6, 5))
    rng = np.random.default_rng(11)
    flat = policy.init(rng).astype(np.float64) + 0.3 * rng.standard_normal(policy.layout.size)
    obs = rng.standard_normal((rows, 3)).astype(np.float32)
    fwd = policy.forward(flat, obs)
    actions = policy.sample(fwd, rng)
    # old log-probs spread so that ratios fall inside and on both sides outside the clip range
    logp_old = (policy.log_prob(fwd, actions) + rng.uniform(-0.6, 0.6, rows)).astype(np.float32)
    return policy, flat, Batch(obs, actions, logp_old, rng.standard_normal(rows).astype(np.float32),
                               rng.standard_normal(rows), rng.standard_normal(rows))


def _finite_differences(loss, flat: np.ndarray) -> np.ndarray:
    numeric = np.zeros_like(flat)
    for i in range(len(flat)):
        step = np.zeros_like(flat)
        step[i] = 1e-6
        numeric[i] = (loss(flat + step) - loss(flat - step)) / 2e-6
    return numeric


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
@pytest.mark.parametrize("learner", [ppo_loss, a2c_loss])
def test_loss_gradients_match_finite_differences(kind: str, learner) -> None:
    policy, flat, data = _problem(kind)
    config = PPOConfig(ent_coef=0.05, vf_coef=0.7, clip=0.2)
    result = learner(policy, flat, data, config)
    numeric = _finite_differences(lambda w: learner(policy, w, data, config).loss, flat)
    assert np.allclose(result.grad, numeric, rtol=1e-5, atol=1e-7), np.abs(result.grad - numeric).max()
    assert np.isclose(result.loss, result.policy_loss + 0.7 * result.value_loss - 0.05 * result.entropy)
    if learner is ppo_loss:
        assert 0.2 < result.clip_fraction < 0.9  # the clip was active on some rows and not on others


def test_the_clipped_objective_ignores_rows_the_clip_holds() -> None:
    policy, flat, data = _problem("categorical")
    config = PPOConfig(vf_coef=0.0, ent_coef=0.0, norm_adv=False)
    fwd = policy.forward(flat, data.obs)
    ratio = np.exp(policy.log_prob(fwd, data.actions) - data.logp)
    held = ((data.advantages > 0) & (ratio > 1.2)) | ((data.advantages < 0) & (ratio < 0.8))
    assert held.any() and (~held).any()
    full = ppo_loss(policy, flat, data, config).grad
    assert np.allclose(full, ppo_loss(policy, flat, data.rows(np.flatnonzero(~held)), config).grad
                       * (~held).sum() / len(data))


def test_minibatch_order_comes_from_seed_version_and_epoch_only() -> None:
    parts = minibatches(7, 3, 1, 1000, 4)
    assert [len(p) for p in parts] == [250] * 4
    order = np.concatenate(parts)
    assert np.array_equal(np.sort(order), np.arange(1000))
    assert np.array_equal(order, np.concatenate(minibatches(7, 3, 1, 1000, 4)))
    for other in ((8, 3, 1), (7, 4, 1), (7, 3, 2)):
        assert not np.array_equal(order, np.concatenate(minibatches(*other, 1000, 4)))


def test_batch_concatenates_shards_in_slot_order() -> None:
    a = _traj([1, 1], [0, 0], [0, 0], [False, True], [False, False])
    b = _traj([2, 2], [0, 5], [5, 5], [False, False], [False, False])
    both = batch([a, b], PPOConfig(gamma=1.0, gae_lambda=1.0))
    assert np.allclose(both.returns, [2, 1, 9, 7])


def test_clip_grad_norm_and_config_checks() -> None:
    g = np.array([3.0, 4.0], np.float32)
    assert np.allclose(clip_grad_norm(g, 1.0), [0.6, 0.8], atol=1e-6) and clip_grad_norm(g, 0) is g
    assert clip_grad_norm(g, 10.0) is g
    with pytest.raises(InputError, match="train.clip"):
        PPOConfig(clip=0)
    with pytest.raises(InputError, match="train.minibatches"):
        PPOConfig(minibatches=0)
