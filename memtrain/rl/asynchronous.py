"""``train.mode = "async"`` of a reinforcement-learning run: a bounded policy lag, and A3C (docs/rl.md).

Each slot has at most one collection task out. A free worker gets the next ready slot's task at the **newest**
published version n; the server takes the shards **in the order they arrive**, one per update:

- a shard collected at version c with n - c > ``train.max_policy_lag`` is deleted and its slot collected again
  at the newest version, from the same episode state: it is never trained on;
- any other is applied: PPO's epochs (or A2C's step) on that shard from the newest weights (``algorithm = "ppo"``),
  or, for A3C (``algorithm = "a2c"``), the actor-critic gradient the task itself computed at version c
  (memtrain/rl/worker.py) applied once to the newest weights -- Hogwild's overlap without its torn reads. The
  result is version n + 1; its lineage line names the shard (slot, the version it was collected at, checksum).

So a version is one shard; the run makes ``versions x slots`` of them (the same environment steps as a
synchronous run). The arrival order depends on the machine; the lineage records it, and
``memtrain train --replay RUN`` re-executes it (``replay``), each version's checksum checked against the record.

A slot's episode continues only through its applied shards: a shard that is too old does not advance it, so its
re-collection starts from the same state, and a replay rebuilds every slot's chain from the lineage alone.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import CorruptFileError, MemtrainError
from memtrain.faults import fault_point
from memtrain.files import append_jsonl, checksum_file, open_npy, seal
from memtrain.layout import (
    EPISODES_DIR,
    RUN_LINEAGE,
    RUN_METRICS,
    TRAJECTORIES_DIR,
    episode_state_name,
    weight_versions,
    weights_path,
)
from memtrain.rl.collect import advance, write_state
from memtrain.rl.config import RLJob
from memtrain.rl.learner import Learned, Learner, learn
from memtrain.rl.metrics import version_metrics
from memtrain.rl.ppo import clip_grad_norm
from memtrain.rl.trajectory import Trajectory, gradient_path, read_shard, shard_path
from memtrain.train.exchange.weights import publish_params
from memtrain.train.messages import CollectTask
from memtrain.train.optim import apply_update
from memtrain.train.records.run_dir import log_event
from memtrain.train.schedule import replay_mismatch


def is_a3c(job: RLJob) -> bool:
    """A3C: async mode with A2C, each task computing its own gradient at the version it collected with."""
    return job.train.mode == "async" and job.rl.algorithm == "a2c"


def updates(job: RLJob) -> int:
    """An async run's final weight version: one shard per version."""
    return job.versions * job.env.slots


@dataclass(frozen=True)
class Applied:
    """One applied shard: the slot, the version it was collected at, and the update's result."""

    slot: int
    collected_at: int
    learned: Learned
    trajectory: Trajectory
    checksum: str


def task_for(job: RLJob, run_dir: Path, position: Any, slot: int, version: int | None = None) -> CollectTask:
    """Slot ``slot``'s next collection task at the newest version (a replay: the recorded one), from the state its
    last applied shard left."""
    episode = position.episodes[slot]
    version = position.version if version is None else version
    path = run_dir / EPISODES_DIR / episode_state_name(slot)
    write_state(path, episode, job.spaces, version=version, slot=slot)
    return CollectTask(task=slot, attempt=0, update=version, version=version, episode=episode.episode,
                       step=episode.step, state_key=episode.key()[2].hex(), state_file=str(path))


def apply_shard(job: RLJob, learner: Learner, run_dir: Path, position: Any, slot: int, collected_at: int) -> Applied:
    """Update ``position`` (at version n) with slot ``slot``'s shard collected at ``collected_at``."""
    folder = run_dir / TRAJECTORIES_DIR
    path = shard_path(folder, collected_at, slot)
    traj = read_shard(path, spaces=job.spaces, version=collected_at, slot=slot, seed=job.train.seed,
                      steps=job.env.steps)
    checksum = checksum_file(path)
    learner = replace(learner, versions=updates(job))  # annealed over the run's updates
    if is_a3c(job):
        learned = _apply_gradient(job, learner, run_dir, position, slot, collected_at, traj)
    else:
        learned = learn(learner, position.weights, position.state, position.step, position.version, [traj])
    return Applied(slot, collected_at, learned, traj, checksum)


def _apply_gradient(job: RLJob, learner: Learner, run_dir: Path, position: Any, slot: int, collected_at: int,
                    traj: Trajectory) -> Learned:
    """A3C: the task's gradient (computed at ``collected_at``), clipped, one optimizer step on the newest weights."""
    from memtrain.rl.ppo import LossResult, batch

    path = gradient_path(run_dir / TRAJECTORIES_DIR, collected_at, slot)
    size = position.weights.size
    record = np.array(open_npy(path, shape=(size + len(GRADIENT_PARTS),), dtype=np.float32))
    if not np.isfinite(record).all():
        raise CorruptFileError("the A3C gradient holds NaN or Inf", path=path)
    grad, (policy_loss, value_loss, entropy) = record[:size], (float(v) for v in record[size:])
    config = learner.config
    stats = LossResult(policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy, np.zeros(0, np.float32),
                       policy_loss, value_loss, entropy)  # A2C at its own weights: KL and clip fraction are 0
    frac = 1.0 - position.version / learner.versions
    lr = learner.optimizer.lr * frac if learner.anneal_lr else learner.optimizer.lr
    step = position.step + 1
    weights, state = np.empty_like(position.weights), {k: np.empty_like(v) for k, v in position.state.items()}
    apply_update(learner.optimizer, step, lr, position.weights, clip_grad_norm(grad, learner.config.max_grad_norm),
                 position.state, weights, state)
    return Learned(weights, state, step, [stats], batch([traj], config), lr)


# what follows the flat gradient in an A3C gradient file: the loss's parts at the task's version, for the metrics
GRADIENT_PARTS = ("policy_loss", "value_loss", "entropy")


def a3c_gradient(job: RLJob, learner: Learner, weights: np.ndarray, traj: Trajectory) -> np.ndarray:
    """The actor-critic (A2C) gradient of one shard at the weights it was collected with (a worker's side),
    followed by the loss's ``GRADIENT_PARTS``: one float32 file, the task's whole result."""
    from memtrain.rl.ppo import a2c_loss, batch

    data = batch([traj], learner.config)
    result = a2c_loss(learner.policy, weights, data.rows(np.arange(len(data))), learner.config)
    parts = np.array([getattr(result, name) for name in GRADIENT_PARTS], np.float32)
    return np.concatenate([result.grad.astype(np.float32), parts])


def record(job: RLJob, policy: Any, run_dir: Path, position: Any, applied: Applied, recent: deque[float],
           rejected: int, started: float) -> tuple[Any, dict[str, Any]]:
    """Publish version n + 1 from ``applied``, its lineage and metrics lines; the new position."""
    from memtrain.rl.server import Position

    version, learned = position.version, applied.learned
    checksum = publish_params(run_dir, version + 1, policy.layout, policy.layout.views(learned.weights),
                              made_by=f"the update on slot {applied.slot}'s shard of version {applied.collected_at}")
    fault_point("rl_after_publish")
    lag = version - applied.collected_at
    line = version_metrics(version, [applied.trajectory], learned.batch, learned.steps)
    returns = [float(r) for r in applied.trajectory.episode_return[applied.trajectory.done]]
    recent.extend(returns)
    line |= {"episode_returns": returns, "return_last100_mean": float(np.mean(recent)) if recent else None,
             "kind": "version", "env_steps_total": (version + 1) * job.env.steps, "lr": learned.lr,
             "slot": applied.slot, "collected_at": applied.collected_at, "policy_lag": lag,
             "collected_again": rejected, "seconds": time.monotonic() - started}
    line["env_steps_per_s"] = job.env.steps / line["seconds"] if line["seconds"] > 0 else None  # since the last
    every = job.rl.eval_every * job.env.slots
    if every and ((version + 1) % every == 0 or version + 1 == updates(job)):
        from memtrain.rl.metrics import eval_metrics
        from memtrain.rl.server import _evaluate

        ended, lengths = _evaluate(job, policy, learned.weights, version + 1)
        line |= {"eval_version": version + 1, **eval_metrics(ended, lengths)}
    shard = {"slot": applied.slot, "version": applied.collected_at, "checksum": applied.checksum}
    append_jsonl(run_dir / RUN_LINEAGE, seal({"version": version + 1, "parent": version, "shards": [shard],
                                              "policy_lag": lag, "optimizer_steps": learned.step - position.step,
                                              "checksum": checksum}))
    append_jsonl(run_dir / RUN_METRICS, line)
    _retire(run_dir, applied)
    episodes = list(position.episodes)
    episodes[applied.slot] = advance(episodes[applied.slot], applied.trajectory, job.spaces)
    return Position(version + 1, learned.weights, learned.state, learned.step, episodes, best=position.best), line


def _retire(run_dir: Path, applied: Applied) -> None:
    for path in (shard_path(run_dir / TRAJECTORIES_DIR, applied.collected_at, applied.slot),
                 gradient_path(run_dir / TRAJECTORIES_DIR, applied.collected_at, applied.slot)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def retire_weights(run_dir: Path, newest: int, oldest_needed: int, keep_versions: int) -> None:
    """Weight versions no task in flight and no future shard within the lag bound can need."""
    limit = min(oldest_needed, newest + 1 - max(keep_versions, 1))
    for old in (v for v in weight_versions(run_dir) if v < limit):
        with contextlib.suppress(FileNotFoundError):
            weights_path(run_dir, old).unlink()


def discard(run_dir: Path, version: int, slot: int) -> None:
    """A shard too old to train on: deleted (with its gradient), never read."""
    for path in (shard_path(run_dir / TRAJECTORIES_DIR, version, slot),
                 gradient_path(run_dir / TRAJECTORIES_DIR, version, slot)):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def run_async(job: RLJob, policy: Any, learner: Learner, run_dir: Path, scheduler: Any, transport: Any,
              position: Any, recent: deque[float], on_version: Any) -> tuple[Any, dict[str, Any]]:
    """The async loop to the run's last version; ``on_version(position, line)`` after each (checkpoints, stops)."""
    stream, bound = scheduler.stream(transport), job.rl.max_policy_lag
    ready, out, last, rejected = deque(range(job.env.slots)), {}, {}, 0
    started = time.monotonic()
    while position.version < updates(job):
        while ready and stream.free() and position.version + len(out) < updates(job):
            slot = ready.popleft()
            task = task_for(job, run_dir, position, slot)
            out[slot] = task.version
            stream.submit(task)
        for task, _ in stream.wait():
            slot, collected_at = task.task, out.pop(task.task)
            if position.version - collected_at > bound:
                rejected += 1
                log_event(run_dir, f"slot {slot}'s shard of version {collected_at} is {position.version - collected_at}"
                                   f" versions old (train.max_policy_lag {bound}): collected again")
                discard(run_dir, collected_at, slot)
            else:
                applied = apply_shard(job, learner, run_dir, position, slot, collected_at)
                position, last = record(job, policy, run_dir, position, applied, recent, rejected, started)
                rejected, started = 0, time.monotonic()
                on_version(position, last)
            ready.append(slot)
        oldest = min(out.values(), default=position.version)
        retire_weights(run_dir, position.version, min(oldest, position.version - bound), job.run.keep_versions)
    return position, last


def replay(job: RLJob, policy: Any, learner: Learner, run_dir: Path, worker: Any, position: Any,
           recent: deque[float], lineage: list[dict[str, Any]], source: Path, on_version: Any) -> tuple[Any, dict]:
    """Re-execute a recorded async run: each version's shard collected again at its recorded version from its
    slot's chain, applied in the recorded order; every version's checksum checked against the record."""
    last: dict[str, Any] = {}
    for entry in lineage[1:]:
        if entry.get("parent") != position.version or len(entry.get("shards", [])) != 1:
            raise MemtrainError("the lineage does not hold an async run's one-shard versions in order",
                                path=source, where=f"version {entry.get('version')}",
                                expected=f"parent {position.version}, one shard", found=str(entry)[:160])
        shard = entry["shards"][0]
        slot, collected_at = int(shard["slot"]), int(shard["version"])
        started = time.monotonic()
        worker.collect(task_for(job, run_dir, position, slot, collected_at))
        applied = apply_shard(job, learner, run_dir, position, slot, collected_at)
        position, last = record(job, policy, run_dir, position, applied, recent, 0, started)
        recorded = entry.get("checksum")
        made = entry_checksum(run_dir, position.version)
        if made != recorded:
            raise replay_mismatch(position.version, recorded, made, source)
        retire_weights(run_dir, position.version, position.version - job.rl.max_policy_lag, job.run.keep_versions)
        on_version(position, last)
    return position, last


def entry_checksum(run_dir: Path, version: int) -> str | None:
    from memtrain.files import read_sealed_jsonl

    lines, _ = read_sealed_jsonl(run_dir / RUN_LINEAGE, what="lineage record")
    return next((r.get("checksum") for r in reversed(lines) if r.get("version") == version), None)
