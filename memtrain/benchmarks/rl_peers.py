"""The peers of `bench rl`: Stable-Baselines3's PPO and a CleanRL-style ppo.py, on the tuned set of rl_bench.ZOO.

Each is what a competent user writes with that tool: SB3 through its public API only (``make_vec_env``,
``PPO("MlpPolicy")`` with the set's keys, a callback to stop at the target); CleanRL's ``ppo.py`` structure
kept (``Agent`` with orthogonal ``layer_init``, ``SyncVectorEnv`` with episode statistics, the rollout into
preallocated tensors, GAE, the flattened batch, epochs x minibatches of the clipped objective, gradient
clipping), on gymnasium's same-step autoreset (the semantics ppo.py was written for; gymnasium 1.x's default
would feed it the step that resets as a transition).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from memtrain.benchmarks.rl_bench import ZOO, Progress


def sb3(spec: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """SB3 PPO on ``spec['envs']`` environments in a SubprocVecEnv (``sb3_subproc``) or a DummyVecEnv."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    class StopAtTarget(BaseCallback):
        """After each rollout: the returns of the episodes that ended in it; stop once the target is reached."""

        def __init__(self) -> None:
            super().__init__()
            self.ended: list[float] = []
            self.reached = False

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:  # the Monitor wrapper's record of an episode that ended
                    self.ended.append(info["episode"]["r"])
            return not self.reached

        def _on_rollout_end(self) -> None:
            self.reached = progress.after_collection(self.num_timesteps, self.ended)
            self.ended = []

    kind = SubprocVecEnv if spec["side"] == "sb3_subproc" else DummyVecEnv
    envs = make_vec_env(spec["env"], n_envs=spec["envs"], seed=spec["seed"], vec_env_cls=kind)
    try:
        model = PPO("MlpPolicy", envs, n_steps=spec["steps"], batch_size=ZOO["batch_size"], n_epochs=ZOO["n_epochs"],
                    gamma=ZOO["gamma"], gae_lambda=ZOO["gae_lambda"], ent_coef=ZOO["ent_coef"],
                    learning_rate=lambda remaining: ZOO["lr"] * remaining,
                    clip_range=lambda remaining: ZOO["clip"] * remaining, vf_coef=ZOO["vf_coef"],
                    max_grad_norm=ZOO["max_grad_norm"], policy_kwargs={"net_arch": list(ZOO["hidden"])},
                    seed=spec["seed"], device="cpu", verbose=0)
        # SB3's default logger makes an empty SB3-<time> folder in the temp dir on every learn(); a logger with
        # no outputs writes nothing (the bench counts episodes through its own callback)
        model.set_logger(Logger(folder=None, output_formats=[]))
        callback = StopAtTarget()
        model.learn(total_timesteps=spec["env_steps"], callback=callback)
        steps = progress.reached_steps or model.num_timesteps
    finally:
        envs.close()
    return progress.result(steps)


def cleanrl(spec: dict[str, Any], progress: Progress) -> dict[str, Any]:
    """CleanRL's ppo.py, its loop as written, on the tuned set (num_envs x num_steps = the set's samples)."""
    import gymnasium as gym
    import torch
    from torch import nn, optim
    from torch.distributions.categorical import Categorical

    def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
        torch.nn.init.orthogonal_(layer.weight, std)
        torch.nn.init.constant_(layer.bias, bias_const)
        return layer

    class Agent(nn.Module):
        def __init__(self, envs: Any):
            super().__init__()
            d, h = int(np.prod(envs.single_observation_space.shape)), ZOO["hidden"]
            self.critic = nn.Sequential(layer_init(nn.Linear(d, h[0])), nn.Tanh(), layer_init(nn.Linear(h[0], h[1])),
                                        nn.Tanh(), layer_init(nn.Linear(h[1], 1), std=1.0))
            self.actor = nn.Sequential(layer_init(nn.Linear(d, h[0])), nn.Tanh(), layer_init(nn.Linear(h[0], h[1])),
                                       nn.Tanh(), layer_init(nn.Linear(h[1], envs.single_action_space.n), std=0.01))

        def get_value(self, x: Any) -> Any:
            return self.critic(x)

        def get_action_and_value(self, x: Any, action: Any = None) -> tuple[Any, Any, Any, Any]:
            probs = Categorical(logits=self.actor(x))
            if action is None:
                action = probs.sample()
            return action, probs.log_prob(action), probs.entropy(), self.critic(x)

    seed, num_envs, num_steps = spec["seed"], spec["envs"], spec["steps"]
    batch_size = num_envs * num_steps
    minibatch_size = ZOO["batch_size"]
    num_iterations = spec["env_steps"] // batch_size
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.backends.cudnn.deterministic = True
    envs = gym.wrappers.vector.RecordEpisodeStatistics(gym.vector.SyncVectorEnv(
        [lambda: gym.make(spec["env"]) for _ in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP))
    agent = Agent(envs)
    optimizer = optim.Adam(agent.parameters(), lr=ZOO["lr"], eps=ZOO["adam_eps"])
    obs = torch.zeros((num_steps, num_envs, *envs.single_observation_space.shape))
    actions = torch.zeros((num_steps, num_envs, *envs.single_action_space.shape))
    logprobs, rewards, dones, values = (torch.zeros((num_steps, num_envs)) for _ in range(4))
    global_step = 0
    next_obs, _ = envs.reset(seed=seed)
    next_obs, next_done = torch.Tensor(next_obs), torch.zeros(num_envs)
    try:
        for iteration in range(1, num_iterations + 1):
            frac = 1.0 - (iteration - 1.0) / num_iterations
            optimizer.param_groups[0]["lr"] = frac * ZOO["lr"]
            clip_coef = frac * ZOO["clip"]  # the set's lin_0.2 (CleanRL keeps its clip_coef constant)
            ended: list[float] = []
            for step in range(num_steps):
                global_step += num_envs
                obs[step], dones[step] = next_obs, next_done
                with torch.no_grad():
                    action, logprob, _, value = agent.get_action_and_value(next_obs)
                    values[step] = value.flatten()
                actions[step], logprobs[step] = action, logprob
                next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
                next_done = np.logical_or(terminations, truncations)
                rewards[step] = torch.tensor(reward).view(-1)
                next_obs, next_done = torch.Tensor(next_obs), torch.Tensor(next_done)
                if "episode" in infos:
                    ended.extend(infos["episode"]["r"][infos["_episode"]])
            if progress.after_collection(global_step, ended):
                break
            with torch.no_grad():
                next_value = agent.get_value(next_obs).reshape(1, -1)
                advantages = torch.zeros_like(rewards)
                lastgaelam = 0
                for t in reversed(range(num_steps)):
                    if t == num_steps - 1:
                        nextnonterminal, nextvalues = 1.0 - next_done, next_value
                    else:
                        nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                    delta = rewards[t] + ZOO["gamma"] * nextvalues * nextnonterminal - values[t]
                    advantages[t] = lastgaelam = delta + ZOO["gamma"] * ZOO["gae_lambda"] * nextnonterminal * lastgaelam
                returns = advantages + values
            b_obs = obs.reshape((-1, *envs.single_observation_space.shape))
            b_logprobs, b_actions = logprobs.reshape(-1), actions.reshape((-1, *envs.single_action_space.shape))
            b_advantages, b_returns = advantages.reshape(-1), returns.reshape(-1)
            b_inds = np.arange(batch_size)
            for _ in range(ZOO["n_epochs"]):
                np.random.shuffle(b_inds)
                for start in range(0, batch_size, minibatch_size):
                    mb_inds = b_inds[start:start + minibatch_size]
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds],
                                                                                  b_actions.long()[mb_inds])
                    ratio = (newlogprob - b_logprobs[mb_inds]).exp()
                    mb_advantages = b_advantages[mb_inds]
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)
                    pg_loss = torch.max(-mb_advantages * ratio,
                                        -mb_advantages * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)).mean()
                    v_loss = 0.5 * ((newvalue.view(-1) - b_returns[mb_inds]) ** 2).mean()  # clip_vloss off
                    loss = pg_loss - ZOO["ent_coef"] * entropy.mean() + v_loss * ZOO["vf_coef"]
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(agent.parameters(), ZOO["max_grad_norm"])
                    optimizer.step()
    finally:
        envs.close()
    return progress.result(progress.reached_steps or global_step)
