"""A trained policy's actions: ``Actor(policy, weights).act(observations, greedy=True)``.

What ``memtrain.load_model(run)`` hands back for a reinforcement-learning run (``load_actor``): the greedy
action (the most likely one; a Gaussian's mean, clipped to the action Box) or a sampled one from a generator
the caller seeds. Actions are as the environment takes them
(a Discrete space's ``start`` added, a Box's bounds applied).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memtrain.errors import InputError
from memtrain.rl.policy import Policy


@dataclass(frozen=True)
class Actor:
    """A policy and its flat float32 weights."""

    policy: Policy
    weights: np.ndarray

    def __post_init__(self) -> None:
        if np.shape(self.weights) != (self.policy.layout.size,):
            raise InputError("the weights do not fit the policy", expected=f"shape ({self.policy.layout.size},)",
                             found=f"shape {np.shape(self.weights)}")

    def act(self, observations: np.ndarray, greedy: bool = True, *,
            rng: np.random.Generator | int | None = None) -> np.ndarray:
        """One action per observation ([N, obs_dim], or one observation [obs_dim] for one action).

        ``greedy``: the most likely action; else sampled with ``rng`` (a generator, or a seed; required, so that
        a sampled action is reproducible). Discrete: int64 [N]; continuous: float32 [N, n] within the Box.
        """
        obs = np.asarray(observations, dtype=np.float32)
        single = obs.ndim == 1
        dim = self.policy.spaces.obs_dim
        if obs.shape[-1:] != (dim,) or obs.ndim not in (1, 2):
            raise InputError("observations of the wrong shape for this policy", expected=f"[N, {dim}] or [{dim}]",
                             found=f"{list(obs.shape)}")
        if not np.isfinite(obs).all():
            raise InputError("observations hold NaN or Inf", found=f"{int(obs.size - np.isfinite(obs).sum())} values")
        fwd = self.policy.forward(self.weights, obs.reshape(-1, dim))
        if greedy:
            actions = self.policy.greedy(fwd)
        else:
            if rng is None:
                raise InputError("a sampled action needs rng (a numpy Generator or a seed)",
                                 hint="act(observations, greedy=False, rng=0)")
            actions = self.policy.sample(fwd, rng if isinstance(rng, np.random.Generator)
                                         else np.random.default_rng(rng))
        out = np.stack([np.asarray(self.policy.spaces.env_action(a)) for a in actions]) if len(actions) else actions
        return out[0] if single else out


def load_actor(path: str | Path, which: str | None = None) -> Actor:
    """The policy of an RL run's newest complete checkpoint (``path``: the run directory, or one of its checkpoint
    directories), every file's checksum verified: what ``memtrain.load_model`` gives for an RL run. ``which``:
    None or "last" (the newest), or "best": the checkpoint of the version whose greedy evaluation return was the
    highest (the newest checkpoint's record of it; ``run.keep_best`` keeps it)."""
    from memtrain.layout import CHECKPOINT_META
    from memtrain.rl.server import checkpoint_dir, job_policy, load_checkpoint, read_checkpoint, read_run_job

    path = Path(path)
    if which not in (None, "last", "best"):
        raise InputError("which= of a reinforcement-learning run",
                         expected="None or 'last' (the newest checkpoint), or 'best' (the best evaluation's)",
                         found=repr(which))
    run = path.parent.parent if (path / CHECKPOINT_META).is_file() else path
    job = read_run_job(run)
    policy = job_policy(job)
    position = read_checkpoint(path, job, policy) if run != path else load_checkpoint(run, job, policy)
    if which == "best":
        if position.best is None:
            raise InputError("the run records no best evaluation", path=run,
                             found=f"train.eval_every = {job.rl.eval_every}", hint="train.eval_every = N evaluates "
                             "the greedy policy every N versions; which='last' loads the newest checkpoint")
        folder = checkpoint_dir(run, position.best["version"])
        if not folder.is_dir():
            raise InputError(f"the checkpoint of the best evaluation (version {position.best['version']}) was "
                             "pruned (run.keep_best = false) or lost", path=folder,
                             hint="run.keep_best = true keeps it; which='last' loads the newest checkpoint")
        position = read_checkpoint(folder, job, policy)
    return Actor(policy, position.weights)
