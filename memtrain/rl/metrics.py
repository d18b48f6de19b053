"""What a user watches per version (issue 40), as pure functions of the version's shards and learner steps,
ready for one ``metrics.jsonl`` line: the returns and lengths of the episodes that ended, the learner's
approximate KL, clip fraction, entropy, value loss and explained variance; and the greedy evaluation episodes,
on reset seeds kept apart from training's.

A value that does not exist (no episode ended in the version; explained variance of constant returns) is
``None`` (JSON null), never NaN.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memtrain.rl.envs import EnvSpec, Slot
from memtrain.rl.ppo import Batch, LossResult
from memtrain.rl.trajectory import Trajectory

# The columns of an RL run's metrics.csv (run.log_to = ["csv"]; memtrain/train/server/monitor.py writes it): fixed,
# since a version's line has the evaluation's keys only every train.eval_every versions
LOG_COLUMNS = ("version", "env_steps_total", "episodes", "return_mean", "return_min", "return_max",
               "return_last100_mean", "length_mean", "length_min", "length_max", "env_steps_per_s", "approx_kl",
               "clip_fraction", "entropy", "value_loss", "policy_loss", "explained_variance", "lr", "policy_lag",
               "eval_version", "eval_return_mean", "eval_return_min", "eval_return_max", "eval_length_mean",
               "seconds")

EVAL_TAG = 0x6576616C  # "eval": the evaluation's reset seeds come from another SeedSequence than training's


def episode_lengths(traj: Trajectory) -> np.ndarray:
    """The length (in steps) of each episode that ended in ``traj``, in order: the first counts the steps it had
    before the shard (``traj.step``)."""
    ends = np.flatnonzero(traj.done)
    starts = np.concatenate([[-traj.step], ends[:-1] + 1])
    return (ends - starts + 1).astype(np.int64)


def episodes(trajectories: Sequence[Trajectory]) -> tuple[np.ndarray, np.ndarray]:
    """(returns, lengths) of the episodes that ended in a version's shards, in slot order."""
    returns = [t.episode_return[t.done] for t in trajectories]
    lengths = [episode_lengths(t) for t in trajectories]
    return (np.concatenate(returns) if returns else np.zeros(0),
            np.concatenate(lengths) if lengths else np.zeros(0, np.int64))


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float | None:
    """1 - Var(returns - values) / Var(returns): 1 for a perfect critic, 0 for a constant one; None when the
    returns do not vary."""
    returns = np.asarray(returns, np.float64)
    spread = float(np.var(returns))
    if len(returns) == 0 or spread == 0.0:
        return None
    return 1.0 - float(np.var(returns - np.asarray(values, np.float64))) / spread


def _summary(name: str, values: np.ndarray) -> dict[str, float | None]:
    if len(values) == 0:
        return {f"{name}_mean": None, f"{name}_min": None, f"{name}_max": None}
    return {f"{name}_mean": float(np.mean(values)), f"{name}_min": float(np.min(values)),
            f"{name}_max": float(np.max(values))}


def version_metrics(version: int, trajectories: Sequence[Trajectory], batch: Batch | None,
                    steps: Sequence[LossResult]) -> dict[str, Any]:
    """One version's line: episodes ended, their return and length (mean/min/max), and the learner's
    approx_kl, clip_fraction, entropy, value_loss, policy_loss (means over its ``steps``, the minibatch updates) and the
    explained variance of the values the shards recorded against their GAE returns."""
    returns, lengths = episodes(trajectories)
    line: dict[str, Any] = {"version": int(version), "env_steps": int(sum(t.steps for t in trajectories)),
                            "episodes": len(returns), **_summary("return", returns), **_summary("length", lengths)}
    for key in ("approx_kl", "clip_fraction", "entropy", "value_loss", "policy_loss"):
        line[key] = float(np.mean([getattr(s, key) for s in steps])) if steps else None
    line["explained_variance"] = explained_variance(batch.value, batch.returns) if batch is not None else None
    return line


def eval_reset_seed(seed: int, episode: int) -> int:
    """The reset seed of evaluation episode ``episode``: from (EVAL_TAG, seed, episode), a SeedSequence of its
    own, apart from every training episode's (memtrain/rl/envs.py reset_seed)."""
    words = np.random.SeedSequence([EVAL_TAG, int(seed), int(episode)]).generate_state(2, np.uint32)
    return int(words[0]) | (int(words[1] & 0x7FFFFFFF) << 32)


def evaluate(act: Callable[[np.ndarray], np.ndarray], spec: EnvSpec, episodes: int, seed: int, *,
             version: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """(returns, lengths) of ``episodes`` episodes of ``act`` (observations [1, D] -> memtrain actions, e.g. the
    greedy policy's ``Policy.greedy`` of a forward), on the evaluation seeds of ``seed``."""
    env = Slot(spec, seed, 0)
    returns, lengths = np.zeros(episodes), np.zeros(episodes, np.int64)
    try:
        for k in range(episodes):
            obs, ended, t = env.reset(k, version=version, seed=eval_reset_seed(seed, k)), False, 0
            while not ended:
                obs, reward, terminated, truncated = env.step(act(obs[None])[0], version=version, step=t)
                returns[k] += reward
                ended, t = terminated or truncated, t + 1
            lengths[k] = t
    finally:
        env.close()
    return returns, lengths


def eval_metrics(returns: np.ndarray, lengths: np.ndarray) -> dict[str, float | None]:
    """The evaluation's part of a version's line."""
    return {**_summary("eval_return", returns), **_summary("eval_length", lengths)}
