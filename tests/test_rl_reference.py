"""memtrain/rl/reference.py: the pieces of memtrain/rl put together learn CartPole-v1, reproducibly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from memtrain.errors import InputError
from memtrain.rl.envs import EnvSpec, Slot
from memtrain.rl.policy import Policy
from memtrain.rl.ppo import PPOConfig
from memtrain.rl.reference import ReferenceConfig, evaluate, train

CARTPOLE = EnvSpec(id="CartPole-v1")


def _zoo(env_steps: int, seed: int = 1) -> ReferenceConfig:
    """rl-zoo's CartPole-v1 PPO set (8 slots x 32 steps, 20 epochs of the whole batch, lr 1e-3 and clip 0.2 both
    annealed to 0, gamma 0.98, lambda 0.8), on a small budget."""
    return ReferenceConfig(CARTPOLE, env_steps=env_steps, slots=8, steps=32, lr=1e-3, anneal_clip=True, adam_eps=1e-8,
                           seed=seed, learner=PPOConfig(gamma=0.98, gae_lambda=0.8, epochs=20, minibatches=1,
                                                        ent_coef=0.0))


def _early_and_late(returns: list[np.ndarray]) -> tuple[float, float]:
    """Mean episode return over the first and the last tenth of the versions."""
    tenth = max(1, len(returns) // 10)
    return float(np.concatenate(returns[:tenth]).mean()), float(np.concatenate(returns[-tenth:]).mean())


def test_ppo_learns_cartpole(tmp_path: Path) -> None:
    _, history = train(_zoo(12_288), tmp_path)
    early, late = _early_and_late(history.returns)
    assert early < 40 and late > 120 and late > 4 * early, (early, late)
    assert list((tmp_path / "trajectories").iterdir()) == []  # every version's shards retired after learning


def test_a2c_learns_cartpole(tmp_path: Path) -> None:
    """10,000 steps: the last tenth averages 5x the first (measured on both OpenBLAS kernels), twice the bar."""
    config = ReferenceConfig(CARTPOLE, algorithm="a2c", env_steps=10_000, slots=8, steps=5, lr=7e-4, anneal_lr=False,
                             learner=PPOConfig(gamma=0.99, gae_lambda=1.0, ent_coef=0.0, norm_adv=False))
    _, history = train(config, tmp_path)
    early, late = _early_and_late(history.returns)
    assert early < 40 and late > 2.5 * early, (early, late)


def test_the_same_job_gives_the_same_bits(tmp_path: Path) -> None:
    config = _zoo(1_024, seed=3)
    first, h1 = train(config, tmp_path / "a")
    second, h2 = train(config, tmp_path / "b")
    assert first.tobytes() == second.tobytes() and h1.losses == h2.losses
    other, _ = train(_zoo(1_024, seed=4), tmp_path / "c")
    assert other.tobytes() != first.tobytes()


def test_bad_jobs_are_refused() -> None:
    with pytest.raises(InputError, match="train.algorithm"):
        ReferenceConfig(CARTPOLE, algorithm="dqn")
    with pytest.raises(InputError, match=r"less than one version's steps \(expected >= env.slots \* env.steps = 512"):
        ReferenceConfig(CARTPOLE, env_steps=100)


@pytest.mark.slow
def test_ppo_solves_cartpole_with_rl_zoos_settings(tmp_path: Path) -> None:
    """rl-zoo's budget, 100k steps: the last 100 training episodes and 100 fresh greedy ones average >= 475
    (measured: 500 and 500 for seeds 1, 2 and 3). Run with ``-m slow``."""
    config = _zoo(100_000)
    weights, history = train(config, tmp_path)
    policy = Policy(Slot(CARTPOLE, 0, 0).spaces, config.hidden)
    greedy = evaluate(policy, weights, CARTPOLE, 100, seed=1001)
    assert history.last_episodes(100).mean() >= 475 and greedy.mean() >= 475, (history.last_episodes(100).mean(),
                                                                                greedy.mean())
