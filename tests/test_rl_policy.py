"""memtrain/rl/policy.py: the actor-critic on a flat vector; its gradient against finite differences (float64)."""

from __future__ import annotations

import numpy as np
import pytest

from memtrain.rl.envs import CONTINUOUS, DISCRETE, Spaces
from memtrain.rl.policy import Policy

SPACES = {"categorical": Spaces(obs_dim=3, kind=DISCRETE, n=4),
          "gaussian": Spaces(obs_dim=3, kind=CONTINUOUS, n=2, low=(-1.0, -1.0), high=(1.0, 1.0))}


def _setup(kind: str, rows: int = 6) -> tuple[Policy, np.ndarray, np.ndarray, np.ndarray]:
    policy = Policy(SPACES[kind], hidden=(5, 4))
    rng = np.random.default_rng(3)
    flat = policy.init(rng).astype(np.float64)
    flat += 0.3 * rng.standard_normal(flat.shape)  # away from the small initial heads, so every term matters
    obs = rng.standard_normal((rows, 3))
    fwd = policy.forward(flat, obs)
    actions = policy.sample(fwd, np.random.default_rng(4))
    return policy, flat, obs, actions


@pytest.mark.parametrize("kind", ["categorical", "gaussian"])
def test_gradient_matches_finite_differences(kind: str) -> None:
    policy, flat, obs, actions = _setup(kind)
    rng = np.random.default_rng(5)
    c_logp, c_ent, c_val = rng.standard_normal((3, len(obs)))

    def loss(w: np.ndarray) -> float:
        fwd = policy.forward(w, obs)
        return float(c_logp @ policy.log_prob(fwd, actions) + c_ent @ policy.entropy(fwd) + c_val @ fwd.value)

    grad = policy.gradient(flat, policy.forward(flat, obs), actions, c_logp, c_ent, c_val)
    numeric = np.zeros_like(flat)
    for i in range(len(flat)):
        step = np.zeros_like(flat)
        step[i] = 1e-6
        numeric[i] = (loss(flat + step) - loss(flat - step)) / 2e-6
    assert np.allclose(grad, numeric, rtol=1e-6, atol=1e-7), np.abs(grad - numeric).max()
    assert np.abs(grad).min() >= 0 and np.count_nonzero(grad) > 0.9 * len(grad)


def test_layout_has_separate_trunks_and_a_log_std_for_gaussian_heads() -> None:
    names = [e.name for e in Policy(SPACES["gaussian"], hidden=(8,)).layout.entries]
    assert names == ["pi.0.w", "pi.0.b", "pi.out.w", "pi.out.b", "v.0.w", "v.0.b", "v.out.w", "v.out.b", "log_std"]
    assert "log_std" not in [e.name for e in Policy(SPACES["categorical"]).layout.entries]


def test_categorical_log_prob_entropy_and_sampling_follow_the_softmax() -> None:
    policy, flat, obs, _ = _setup("categorical", rows=1)
    fwd = policy.forward(flat, obs)
    p = np.exp(fwd.out[0] - fwd.out[0].max())
    p /= p.sum()
    every = np.arange(4)
    many = policy.forward(flat, np.repeat(obs, 4, axis=0))
    assert np.allclose(np.exp(policy.log_prob(many, every)), p)
    assert np.isclose(policy.entropy(fwd)[0], -np.sum(p * np.log(p)))
    draws = policy.sample(policy.forward(flat, np.repeat(obs, 40000, axis=0)), np.random.default_rng(0))
    assert np.allclose(np.bincount(draws, minlength=4) / 40000, p, atol=0.01)
    assert policy.greedy(fwd)[0] == np.argmax(p)


def test_gaussian_sampling_uses_mean_and_log_std_and_only_the_given_generator() -> None:
    policy, flat, obs, _ = _setup("gaussian", rows=1)
    policy.layout.views(flat)["log_std"][...] = [np.log(0.5), np.log(2.0)]
    fwd = policy.forward(flat, np.repeat(obs, 40000, axis=0))
    draws = policy.sample(fwd, np.random.default_rng(1))
    assert draws.dtype == np.float32 and draws.shape == (40000, 2)
    assert np.allclose(draws.mean(axis=0), fwd.out[0], atol=0.03)
    assert np.allclose(draws.std(axis=0), [0.5, 2.0], rtol=0.02)
    again = policy.sample(fwd, np.random.default_rng(1))
    assert np.array_equal(draws, again)
    assert np.isclose(policy.entropy(fwd)[0], np.sum(0.5 * np.log(2 * np.pi * np.e * np.array([0.25, 4.0]))))
    assert np.array_equal(policy.greedy(fwd)[0], fwd.out[0].astype(np.float32))


def test_float32_forward_is_float32_and_init_is_seeded() -> None:
    policy = Policy(SPACES["categorical"])
    a, b = policy.init(np.random.default_rng(9)), policy.init(np.random.default_rng(9))
    assert a.dtype == np.float32 and np.array_equal(a, b) and len(a) == policy.layout.size
    w = policy.layout.views(a)["pi.0.w"]
    assert np.allclose(w @ w.T, 2.0 * np.eye(3), atol=1e-5)  # orthogonal rows (3 x 64) with gain sqrt(2)
    fwd = policy.forward(a, np.ones((2, 3)))
    assert fwd.out.dtype == np.float32 and fwd.value.dtype == np.float32
