"""A torch actor-critic for jobs/examples/cartpole-torch-a2c.toml (docs/rl.md).

memtrain calls ``make_actor_critic(obs_dim, n, kind, hidden=...)``: ``kind`` is "discrete" (``n`` actions) or
"continuous" (``n`` action dimensions). ``forward(obs)`` returns ``(out, value)``: the logits (discrete) or the
Gaussian means (continuous), shape [N, n], and V(obs), shape [N]. A continuous policy also has a parameter
``log_std`` of shape [n].
"""

from __future__ import annotations

import torch
from torch import nn


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, n: int, kind: str, hidden: int = 64) -> None:
        super().__init__()
        self.actor = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                   nn.Linear(hidden, n))
        self.critic = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                    nn.Linear(hidden, 1))
        if kind == "continuous":
            self.log_std = nn.Parameter(torch.zeros(n))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.actor(obs), self.critic(obs)[:, 0]


def make_actor_critic(obs_dim: int, n: int, kind: str, hidden: int = 64) -> ActorCritic:
    return ActorCritic(obs_dim, n, kind, hidden)
