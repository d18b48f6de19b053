"""memtrain/rl/metrics.py and act.py: a version's metrics as pure functions, evaluation episodes on seeds apart
from training's, and a trained policy's actions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from memtrain.errors import InputError
from memtrain.files import publish_array
from memtrain.rl import metrics
from memtrain.rl.act import Actor
from memtrain.rl.collect import EpisodeState, collect
from memtrain.rl.envs import CONTINUOUS, DISCRETE, EnvSpec, Slot, Spaces, reset_seed
from memtrain.rl.metrics import episode_lengths, eval_reset_seed, evaluate, explained_variance, version_metrics
from memtrain.rl.policy import Policy
from memtrain.rl.ppo import PPOConfig, batch, ppo_loss

CARTPOLE = EnvSpec(id="CartPole-v1")


def _cartpole_shards(tmp_path: Path, versions: int = 3, steps: int = 100) -> tuple[Policy, np.ndarray, list]:
    spaces = Slot(CARTPOLE, 0, 0).spaces
    policy = Policy(spaces, (16, 16))
    flat = policy.init(np.random.default_rng(0))
    publish_array(tmp_path / "w.npy", flat, durable=False)
    state, shards = EpisodeState.start(spaces), []
    for v in range(versions):
        done = collect(tmp_path / "w.npy", v, 0, CARTPOLE, 5, steps, state, out_dir=tmp_path, hidden=(16, 16))
        shards.append(done.trajectory)
        state = done.state
    return policy, flat, shards


def test_episode_lengths_count_the_steps_before_the_shard(tmp_path: Path) -> None:
    _, _, shards = _cartpole_shards(tmp_path)
    spanning = 0
    for traj in shards:
        lengths = episode_lengths(traj)
        # CartPole pays 1 per step: an episode's return is its length, the steps before this shard included
        assert np.array_equal(lengths, traj.episode_return[traj.done].astype(np.int64))
        spanning += traj.step > 0 and traj.done.any()
    assert spanning >= 1  # an episode began in an earlier shard and ended in this one


def test_explained_variance() -> None:
    returns = np.array([1.0, 2.0, 4.0, 8.0])
    assert explained_variance(returns, returns) == 1.0
    assert explained_variance(np.full(4, returns.mean()), returns) == pytest.approx(0.0)
    assert explained_variance(returns - 1.0, returns) == 1.0  # an offset is not variance
    assert explained_variance(returns, np.ones(4)) is None


def test_a_versions_metrics_line(tmp_path: Path) -> None:
    policy, flat, shards = _cartpole_shards(tmp_path, versions=1, steps=200)
    config = PPOConfig()
    data = batch(shards, config)
    steps = [ppo_loss(policy, flat, data.rows(np.arange(i, 200, 2)), config) for i in range(2)]
    line = version_metrics(0, shards, data, steps)
    returns = shards[0].episode_return[shards[0].done]
    assert line["episodes"] == len(returns) > 2 and line["env_steps"] == 200
    assert (line["return_mean"], line["return_min"], line["return_max"]) == (
        returns.mean(), returns.min(), returns.max())
    assert line["length_max"] == returns.max()
    assert line["approx_kl"] == np.mean([s.approx_kl for s in steps])
    assert line["entropy"] == pytest.approx(np.log(2), rel=1e-3)  # the initial policy is near uniform
    assert line["value_loss"] == np.mean([s.value_loss for s in steps])
    assert line["explained_variance"] == explained_variance(data.value, data.returns)
    json.dumps(line, allow_nan=False)
    empty = version_metrics(1, [], data, [])
    assert empty["return_mean"] is None and empty["approx_kl"] is None
    json.dumps(empty, allow_nan=False)


def test_evaluation_seeds_are_apart_from_trainings_and_episodes_are_reproducible(tmp_path: Path) -> None:
    training = {reset_seed(1, slot, k) for slot in range(16) for k in range(200)}
    assert not training & {eval_reset_seed(1, k) for k in range(200)}
    policy, flat, _ = _cartpole_shards(tmp_path, versions=1)

    def greedy(obs: np.ndarray) -> np.ndarray:
        return policy.greedy(policy.forward(flat, obs))

    returns, lengths = evaluate(greedy, CARTPOLE, 4, seed=1)
    again = evaluate(greedy, CARTPOLE, 4, seed=1)
    assert np.array_equal(returns, again[0]) and np.array_equal(lengths, again[1])
    assert np.array_equal(returns, lengths)  # CartPole: 1 per step
    first = Slot(CARTPOLE, 1, 0)
    assert not np.array_equal(first.reset(0, version=0), first.reset(0, version=0, seed=eval_reset_seed(1, 0)))
    assert metrics.eval_metrics(returns, lengths)["eval_return_mean"] == returns.mean()


def _plain_forward(policy: Policy, flat: np.ndarray, obs: np.ndarray) -> np.ndarray:
    """The actor's output written out by hand from the layout's names (independent of Policy.forward)."""
    views = policy.layout.views(flat.astype(np.float64))
    x = obs.astype(np.float64)
    for i in range(len(policy.hidden)):
        x = np.tanh(x @ views[f"pi.{i}.w"] + views[f"pi.{i}.b"])
    return x @ views["pi.out.w"] + views["pi.out.b"]


def test_act_greedy_and_sampled() -> None:
    rng = np.random.default_rng(3)
    obs = rng.standard_normal((50, 3)).astype(np.float32)
    discrete = Policy(Spaces(obs_dim=3, kind=DISCRETE, n=4, start=1), (8,))
    flat = discrete.init(rng) * 4
    actor = Actor(discrete, flat)
    assert np.array_equal(actor.act(obs), np.argmax(_plain_forward(discrete, flat, obs), axis=1) + 1)
    assert actor.act(obs[0]) == actor.act(obs)[0]
    sampled = actor.act(obs, greedy=False, rng=7)
    assert np.array_equal(sampled, actor.act(obs, greedy=False, rng=np.random.default_rng(7)))
    assert set(sampled.tolist()) <= {1, 2, 3, 4} and not np.array_equal(sampled, actor.act(obs))
    box = Policy(Spaces(obs_dim=3, kind=CONTINUOUS, n=2, low=(-1.0, 0.0), high=(1.0, 0.5)), (8,))
    flat = box.init(rng) * 50
    means = _plain_forward(box, flat, obs)
    assert np.allclose(Actor(box, flat).act(obs), np.clip(means, [-1.0, 0.0], [1.0, 0.5]), atol=1e-5)
    for call, message in ((lambda: actor.act(obs, greedy=False), "needs rng"),
                          (lambda: actor.act(obs[:, :2]), "wrong shape"),
                          (lambda: actor.act(obs * np.nan), "NaN"),
                          (lambda: Actor(discrete, flat), "do not fit")):
        with pytest.raises(InputError, match=message):
            call()
