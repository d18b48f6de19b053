"""memtrain's side of `bench rl`: memtrain.rl's PPO with 0 or more collecting workers, stopping at a target.

``memtrain train`` runs RL jobs now (memtrain/rl/server.py), but this side is not moved onto it yet:
``run_memtrain`` drives memtrain.rl's own pieces the way memtrain/rl/reference.py does -- publish version v, one
collection task per slot (the shard written whole and renamed), the shards read back and checked in slot order, the
PPO epochs with memtrain's Adam -- with the collection tasks either in this process (0 workers: reference.train's
loop, bit for bit) or in ``workers`` forked processes, slot e always on worker e % workers so that each keeps its
slots' live environments (``SlotCache``). Only names and episode states (arrays) travel through the pipes; the
trajectories travel as shard files. A collection task is pure, so the weights are the same bits for any worker count
(the bench checks it).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from memtrain.errors import MemtrainError
from memtrain.files import publish_array
from memtrain.layout import weights_path
from memtrain.rl.collect import EpisodeState, SlotCache, blas_controller, collect
from memtrain.rl.envs import Slot
from memtrain.rl.policy import Policy
from memtrain.rl.reference import ReferenceConfig, _learn, _retire
from memtrain.rl.trajectory import read_shard, shard_path
from memtrain.train.optim import OptimizerConfig, state_names

Collector = Callable[[Path, int, list[EpisodeState]], list[EpisodeState]]


def run_memtrain(config: ReferenceConfig, run_dir: Path, *, workers: int, progress: Any) -> dict[str, Any]:
    """Train ``config`` in ``run_dir`` with ``workers`` collecting processes (0: in this process) until
    ``progress.after_collection`` says the target is reached or the budget is spent; ``progress.result`` with the
    final weights' digest."""
    with blas_controller().limit(limits=1):
        pool = Pool(config, run_dir, workers) if workers else None
        try:
            weights, steps = _train(config, run_dir, progress, pool.collect if pool else _in_process(config, run_dir))
        finally:
            if pool is not None:
                pool.close()
    return progress.result(steps, digest=xxhash.xxh3_128_hexdigest(weights.tobytes()))


def _train(config: ReferenceConfig, run_dir: Path, progress: Any, collector: Collector) -> tuple[np.ndarray, int]:
    spaces = Slot(config.env, config.seed, 0).spaces
    policy = Policy(spaces, config.hidden)
    weights = policy.init(np.random.default_rng(np.random.SeedSequence([0x696E6974, config.seed])))
    state = {name: np.zeros_like(weights) for name in state_names(OptimizerConfig(name="adam", lr=config.lr))}
    shards = Path(run_dir) / "trajectories"
    weights_path(Path(run_dir), 0).parent.mkdir(parents=True, exist_ok=True)
    shards.mkdir(parents=True, exist_ok=True)
    episodes = [EpisodeState.start(spaces) for _ in range(config.slots)]
    step, done_steps = 0, 0
    for version in range(config.versions):
        path = weights_path(Path(run_dir), version)
        publish_array(path, weights, durable=False)
        episodes = collector(path, version, episodes)
        trajectories = [read_shard(shard_path(shards, version, slot), spaces=spaces, version=version, slot=slot,
                                   seed=config.seed, steps=config.steps) for slot in range(config.slots)]
        done_steps += config.slots * config.steps
        if progress.after_collection(done_steps, np.concatenate([t.episode_return[t.done] for t in trajectories])):
            break
        weights, state, step, _ = _learn(config, policy, weights, state, step, version, trajectories)
        _retire(shards, version, config.slots)
        os.unlink(path)
    return weights, done_steps


def _in_process(config: ReferenceConfig, run_dir: Path) -> Collector:
    cache = SlotCache()

    def collector(path: Path, version: int, episodes: list[EpisodeState]) -> list[EpisodeState]:
        return [collect(path, version, slot, config.env, config.seed, config.steps, episodes[slot],
                        out_dir=Path(run_dir) / "trajectories", hidden=config.hidden, cache=cache).state
                for slot in range(config.slots)]

    return collector


class Pool:
    """``workers`` forked processes running collection tasks; slot e on worker e % workers."""

    def __init__(self, config: ReferenceConfig, run_dir: Path, workers: int):
        context = multiprocessing.get_context("fork")
        self.config, self.spaces = config, Slot(config.env, config.seed, 0).spaces
        self.pipes, self.processes = [], []
        for _ in range(workers):
            mine, theirs = context.Pipe()
            process = context.Process(target=_worker, args=(theirs, config, Path(run_dir) / "trajectories"),
                                      daemon=True)
            process.start()
            theirs.close()
            self.pipes.append(mine)
            self.processes.append(process)

    def collect(self, path: Path, version: int, episodes: list[EpisodeState]) -> list[EpisodeState]:
        count = len(self.pipes)
        for w, pipe in enumerate(self.pipes):
            pipe.send((str(path), version, [(slot, episodes[slot].to_arrays())
                                             for slot in range(w, self.config.slots, count)]))
        after = list(episodes)
        for w, pipe in enumerate(self.pipes):
            answer = pipe.recv()
            if isinstance(answer, str):
                raise MemtrainError(f"bench rl: collecting worker {w} failed at version {version}", found=answer)
            for slot, arrays in answer:
                after[slot] = EpisodeState.from_arrays(arrays, self.spaces)
        return after

    def close(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):  # a worker already gone
                pipe.send(None)
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join()


def _worker(pipe: Any, config: ReferenceConfig, out_dir: Path) -> None:
    cache, spaces = SlotCache(), Slot(config.env, config.seed, 0).spaces
    try:
        while (message := pipe.recv()) is not None:
            path, version, tasks = message
            try:
                answer: Any = [(slot, collect(Path(path), version, slot, config.env, config.seed, config.steps,
                                              EpisodeState.from_arrays(arrays, spaces), out_dir=out_dir,
                                              hidden=config.hidden, cache=cache).state.to_arrays())
                               for slot, arrays in tasks]
            except Exception as exc:  # reported to the learner, which stops the run naming it
                answer = f"{type(exc).__name__}: {exc}"
            pipe.send(answer)
    finally:
        cache.close()
