"""A user environment for jobs/examples/user-env-ppo.toml: a walker on a line must reach +5.

The gymnasium API (reset with a seed, step, the two spaces). Every random draw comes from ``self.np_random``,
seeded by ``reset(seed=...)``: an episode is then a function of its reset seed and the actions, which is what
lets memtrain re-simulate a slot after a crash or a resume (docs/rl.md).
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np


class GridWalk(gym.Env):
    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)  # 0: left, 1: right
        self.pos, self.t = 0.0, 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.pos, self.t = float(self.np_random.uniform(-2.0, 2.0)), 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        slip = self.np_random.random() < 0.1  # a tenth of the moves go the other way
        self.pos += (1.0 if (int(action) == 1) != slip else -1.0)
        self.t += 1
        reached = self.pos >= 5.0
        return self._obs(), (1.0 if reached else -0.1), reached, self.t >= 50, {}

    def _obs(self) -> np.ndarray:
        return np.array([self.pos / 5.0, self.t / 50.0], np.float32)


def make_env() -> GridWalk:
    return GridWalk()
