"""Environment factories for tests/test_rl_*.py: well-behaved ones and ones that misbehave on purpose."""

from __future__ import annotations

import gymnasium as gym
import numpy as np


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1", disable_env_checker=True)


def pendulum() -> gym.Env:
    return gym.make("Pendulum-v1", disable_env_checker=True)


class _Walk(gym.Env):
    """A 2-D walk: the action moves the position; the episode terminates outside a box, truncates after 30 steps."""

    def __init__(self, action_space: gym.Space | None = None, fail_at: int | None = None) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = action_space or gym.spaces.Discrete(4)
        self.fail_at, self.t, self.pos = fail_at, 0, np.zeros(2, np.float32)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t, self.pos = 0, self.np_random.normal(size=2).astype(np.float32)
        return self.pos.copy(), {}

    def step(self, action: object) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.fail_at is not None and self.t == self.fail_at:
            raise RuntimeError("the simulator lost its state")
        moves = np.array([[1, 0], [-1, 0], [0, 1], [0, -1]], np.float32)
        self.pos = self.pos + 0.5 * moves[int(action)] + self.np_random.normal(scale=0.1, size=2).astype(np.float32)
        self.t += 1
        return self.pos.copy(), float(-np.abs(self.pos).sum()), bool(np.abs(self.pos).max() > 3), self.t >= 30, {}


def walk() -> gym.Env:
    """Randomness inside steps (the env's own seeded generator), terminations and truncations."""
    return _Walk()


def raises_at_step_3() -> gym.Env:
    return _Walk(fail_at=3)


class _Flaky(_Walk):
    """The walk, but its step raises the first ``FLAKY["failures"]`` times it reaches step 3 in this process (a
    transient fault: a retry from the task's start goes through). ``FLAKY["made"]`` counts the copies made."""

    def __init__(self) -> None:
        super().__init__()
        FLAKY["made"] += 1

    def step(self, action: object) -> tuple[np.ndarray, float, bool, bool, dict]:
        if self.t == 3 and FLAKY["failures"] > 0:
            FLAKY["failures"] -= 1
            raise ConnectionError("the simulator's server did not answer")
        return super().step(action)


FLAKY = {"failures": 0, "made": 0}


def flaky() -> gym.Env:
    return _Flaky()


def multi_discrete_actions() -> gym.Env:
    return _Walk(action_space=gym.spaces.MultiDiscrete([2, 3]))


def image_observations() -> gym.Env:
    env = _Walk()
    env.observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    return env


def not_an_env() -> object:
    return {"reset": None}


def raises() -> gym.Env:
    raise ValueError("no licence for the simulator")


NOT_CALLABLE = 3


class _NaNAfter(_Walk):
    """At its second step, a NaN observation (or an infinite reward)."""

    def __init__(self, in_reward: bool) -> None:
        super().__init__()
        self.in_reward = in_reward

    def step(self, action: object) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = super().step(action)
        if self.t == 2:
            obs, reward = (obs, float("inf")) if self.in_reward else (obs * np.nan, reward)
        return obs, reward, terminated, truncated, info


def nan_observation_at_step_2() -> gym.Env:
    return _NaNAfter(in_reward=False)


def infinite_reward_at_step_2() -> gym.Env:
    return _NaNAfter(in_reward=True)
