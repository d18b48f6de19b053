"""``memtrain train`` of a reinforcement-learning job: the server's loop, synchronous (staleness 0 or 1; async mode and
A3C: memtrain/rl/asynchronous.py).

Per version v (docs/rl.md):

1. weight version v is published (``weights/vNNNNNNNN.npy``, train/exchange/weights.py ``publish_params``: the
   same publish path as training), and each slot's episode state at the start of v is published as a small
   .npy (``episodes/``, memtrain/rl/collect.py ``write_state``);
2. one ``CollectTask`` (v, e) per slot goes through the scheduler (train/server/scheduler.py) to the workers by
   name, or to the server itself with 0 workers (``InServer``); each maps v read-only, steps its slot and
   publishes its shard whole (memtrain/rl/worker.py). A worker that dies has its task run again on its
   replacement: the task is pure, so the shard has the same bits;
3. the server reads the shards back in slot order (each validated, its checksum recorded in the lineage),
   advances each slot's episode state from its shard, learns (memtrain/rl/learner.py, memtrain's optimizer) and
   publishes v + 1; then the version's ``metrics.jsonl`` line (with the greedy evaluation when due), and a
   checkpoint every ``run.checkpoint_every`` versions.

With ``train.staleness = 1`` step 3 learns from the shards collected with v - 1 instead, during step 2 (in a
thread beside the dispatch), and those shards are part of the checkpoint (DPPO's kept buffers).

Nothing depends on the worker count: the same job gives the same bits with 0, 1, 2 or more workers, and the same
bits as memtrain/rl/reference.py's single-process loop. A checkpoint holds the weights, the optimizer state and
each slot's episode state as plain .npy files (never a pickle); a resumed run re-simulates each slot's episode from
its seeded reset and the recorded actions, and continues bit for bit as the uninterrupted run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memtrain import config as base_config
from memtrain.errors import CorruptFileError, InputError, Interrupted, MemtrainError, plural
from memtrain.faults import fault_point
from memtrain.files import (
    append_jsonl,
    checksum_file,
    fsync_dir,
    open_npy,
    publish,
    publish_array,
    read_json,
    read_jsonl,
    read_sealed_jsonl,
    seal,
    sweep_orphans,
    unseal,
    write_json,
)
from memtrain.layout import (
    CHECKPOINT_META,
    CHECKPOINT_WEIGHTS,
    CHECKPOINTS_DIR,
    EPISODES_DIR,
    RUN_JOB,
    RUN_LINEAGE,
    RUN_METRICS,
    TRAJECTORIES_DIR,
    WEIGHTS_DIR,
    episode_state_name,
    is_rl_step_file,
    optimizer_state_name,
    rl_share_name,
    rl_step_name,
    tmp_sibling,
    weights_path,
)
from memtrain.rl.asynchronous import replay, run_async, updates
from memtrain.rl.collect import EpisodeState, advance, blas_controller, read_state, write_state
from memtrain.rl.config import RLJob, rl_job_from_dict
from memtrain.rl.kind import RUN_FORMAT
from memtrain.rl.learner import SHARE_PARTS, Learner, Minibatch, Shares, learn, write_step
from memtrain.rl.metrics import LOG_COLUMNS, eval_metrics, evaluate, version_metrics
from memtrain.rl.policy import Policy
from memtrain.rl.ppo import LossResult, PPOConfig
from memtrain.rl.trajectory import Trajectory, read_shard, shard_path
from memtrain.stopping import StopRequest, on_stop_signals, start_resource_tracker
from memtrain.train.exchange.weights import publish_params
from memtrain.train.messages import CollectTask, GradTask, RLWorkerSetup
from memtrain.train.optim import state_names
from memtrain.train.records.checkpoint import prune_checkpoints
from memtrain.train.records.run_dir import acquire_lock, log_event, write_params
from memtrain.train.server.monitor import improves, metric_logs
from memtrain.train.server.scheduler import CORES, Scheduler

RECENT_EPISODES = 100  # metrics.jsonl's return_last100_mean: CartPole's "solved" mark is 475 over the last 100
INIT_TAG = 0x696E6974  # "init": the numpy policy's initial weights come from SeedSequence([INIT_TAG, seed])


# --- the job and its policy ---


def read_raw(path: Path, overrides: list[str], workers: int | None, run_dir: Path | None) -> dict[str, Any]:
    """The job file's tables with ``--set``/``--workers``/``--run-dir`` applied, every path made absolute (so
    that ``job.json`` reads the same from anywhere)."""
    raw = base_config._read_toml(path)
    base_config._apply_overrides(raw, overrides, None, workers)
    if run_dir is not None:
        raw.setdefault("run", {})["dir"] = str(Path(run_dir).resolve())  # --run-dir: from the working directory
    raw.setdefault("run", {}).setdefault("dir", str(Path("runs") / path.stem))
    return absolute(raw, path.resolve().parent)


def absolute(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    """``raw`` with run.dir and the code directories resolved against ``base``."""
    raw = {section: dict(values) if isinstance(values, dict) else values for section, values in raw.items()}
    for section, key, default in (("run", "dir", None), ("env", "code_dir", "."), ("model", "code_dir", ".")):
        table = raw.get(section)
        if not isinstance(table, dict):
            continue
        needed = key in table or (section == "env" and "factory" in table) or \
            (section == "model" and table.get("kind") == "torch")
        if needed and isinstance(table.get(key, default), str):
            table[key] = str((base / table.get(key, default)).resolve())
    return raw


def read_run_job(run_dir: Path) -> RLJob:
    """The job a reinforcement-learning run was started with (its ``job.json``)."""
    record = unseal(read_json(run_dir / RUN_JOB, what="the run's job record"), path=run_dir / RUN_JOB,
                    what="the run's job record")
    if record.get("kind") != RUN_FORMAT or not isinstance(record.get("job"), dict):
        raise CorruptFileError("not a reinforcement-learning run's job record", path=run_dir / RUN_JOB,
                               expected=f'{{"kind": "{RUN_FORMAT}", "job": {{...}}}}',
                               found=str(record)[:120])
    raw = record["job"]
    raw.setdefault("run", {})["dir"] = str(run_dir)
    return rl_job_from_dict(raw, base=run_dir, where=run_dir / RUN_JOB)


def job_policy(job: RLJob) -> Policy:
    """The job's actor-critic: the numpy MLP, or the torch module of ``model.factory`` (kind = "torch")."""
    if job.model.kind == "torch":
        from memtrain.rl.torch_policy import torch_policy

        options = {k: v for k, v in job.model.options.items() if k not in ("factory", "code_dir")}
        return torch_policy(job.model.options["factory"], job.spaces, options, seed=job.train.seed,
                            code_dir=job.model.options.get("code_dir"))
    return Policy(job.spaces, tuple(job.model.options.get("hidden", (64, 64))))


def initial_weights(policy: Policy, seed: int) -> np.ndarray:
    """Version 0: the policy's initialisation from (INIT_TAG, seed) (a torch module's own, made under the seed)."""
    return policy.init(np.random.default_rng(np.random.SeedSequence([INIT_TAG, int(seed)])))


def learner_of(job: RLJob, policy: Policy) -> Learner:
    rl = job.rl
    config = PPOConfig(gamma=rl.gamma, gae_lambda=rl.gae_lambda, clip=rl.clip, vf_coef=rl.vf_coef,
                       ent_coef=rl.ent_coef, epochs=rl.epochs, minibatches=rl.minibatches, norm_adv=rl.norm_adv,
                       max_grad_norm=rl.max_grad_norm)
    return Learner(policy, job.train.optimizer, config, rl.algorithm, job.train.seed, job.versions, rl.anneal_lr,
                   rl.anneal_clip, rl.learner_chunks)


def refuse_unsupported(job: RLJob, where: Any) -> None:
    """What ``memtrain train`` does not run yet for an RL job: a clear refusal naming the key."""
    if job.train.mode == "async" and job.train.staleness:
        raise InputError("train.staleness applies to train.mode = 'sync'", path=where,
                         expected="train.staleness = 0 in async mode", found=f"train.staleness = {job.train.staleness}",
                         hint="async mode bounds the policy lag with train.max_policy_lag")
    if job.run.cluster:
        raise InputError("reinforcement learning runs on this machine only, so far", path=where,
                         expected="run.cluster unset", found=f"run.cluster = {job.run.cluster!r}")


# --- the run directory ---


@dataclass
class Position:
    """Where a run stands at the start of a version's collection: the version, the weights, the optimizer state and
    its step count, each slot's episode state, and the environment steps done."""

    version: int
    weights: np.ndarray
    state: dict[str, np.ndarray]
    step: int
    episodes: list[EpisodeState]
    # staleness 1: the shards collected with version - 1, learned from while version collects (DPPO's kept
    # buffers), and their lineage entries (slot, version, checksum); empty at version 0 and with staleness 0
    pending: list[Trajectory] = field(default_factory=list)
    pending_shards: list[dict[str, Any]] = field(default_factory=list)
    # the best greedy evaluation so far: {"version": V, "eval_return_mean": R} (its checkpoint is kept, run.keep_best)
    best: dict[str, Any] | None = None

    def env_steps(self, job: RLJob) -> int:
        return min(self.version, job.versions) * job.env.slots * job.env.steps


def _create_run(run_dir: Path, raw: dict[str, Any], policy: Policy, overwrite: bool) -> None:
    if run_dir.exists() and any(run_dir.iterdir()):
        if not overwrite:
            raise InputError("the run directory already holds files", path=run_dir,
                             hint=f"continue that run with `memtrain train --resume {run_dir}`, replace it with "
                                  "--overwrite, or choose another with --run-dir")
        if not (run_dir / RUN_JOB).is_file():
            raise InputError("--overwrite replaces only a run directory memtrain created", path=run_dir,
                             found=f"no {RUN_JOB} in it")
        shutil.rmtree(run_dir)
    for folder in (run_dir, run_dir / WEIGHTS_DIR, run_dir / TRAJECTORIES_DIR, run_dir / EPISODES_DIR,
                   run_dir / CHECKPOINTS_DIR):
        folder.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / RUN_JOB, seal({"kind": RUN_FORMAT, "job": raw}), durable=True)
    write_params(run_dir, policy.layout.to_json())


def checkpoint_dir(run_dir: Path, version: int) -> Path:
    return run_dir / CHECKPOINTS_DIR / f"c{version:08d}"


def save_checkpoint(run_dir: Path, job: RLJob, position: Position, keep: int, *, best_only: bool = False) -> Path:
    """A checkpoint of ``position``: .npy files and a meta.json with their checksums, complete or absent (written
    under a temporary name, synced, renamed). ``best_only``: written because its version's evaluation is the best
    so far, off the schedule; it goes once another is better (the supervised runs' keep rule,
    train/records/checkpoint.py ``prune_checkpoints``)."""
    final = checkpoint_dir(run_dir, position.version)
    if final.exists():
        return final
    tmp = tmp_sibling(final)
    tmp.mkdir(parents=True)
    files = {CHECKPOINT_WEIGHTS: position.weights}
    files |= {optimizer_state_name(name): array for name, array in position.state.items()}
    for name, array in files.items():
        publish_array(tmp / name, array, durable=True)
    for slot, episode in enumerate(position.episodes):
        write_state(tmp / episode_state_name(slot), episode, job.spaces, version=position.version, slot=slot,
                    durable=True)
    pending = []
    for entry in position.pending_shards:  # staleness 1: the kept shards, byte for byte (their lineage checksums)
        source = shard_path(run_dir / TRAJECTORIES_DIR, entry["version"], entry["slot"])
        data = source.read_bytes()
        publish(tmp / source.name, lambda handle, data=data: handle.write(data), durable=True)
        pending.append(source.name)
    sums = {name: checksum_file(tmp / name) for name in sorted(os.listdir(tmp))}
    write_json(tmp / CHECKPOINT_META, seal({"kind": RUN_FORMAT, "version": position.version, "step": position.step,
                                            "slots": job.env.slots, "pending": pending, "files": sums,
                                            "best": position.best, "best_only": best_only}),
               durable=True)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    protect = position.best["version"] if position.best is not None and job.run.keep_best else None
    prune_checkpoints(run_dir, keep, protect, best_only=_best_only)
    return final


def _best_only(folder: Path) -> bool:
    """Whether a checkpoint was written only as the best evaluation's (a damaged one: pruned as any other)."""
    try:
        meta = unseal(read_json(folder / CHECKPOINT_META, what="checkpoint meta"), path=folder / CHECKPOINT_META,
                      what="checkpoint meta")
    except MemtrainError:
        return False
    return meta.get("best_only") is True


def checkpoints(run_dir: Path) -> list[int]:
    folder = run_dir / CHECKPOINTS_DIR
    names = os.listdir(folder) if folder.is_dir() else []
    return sorted(int(n[1:]) for n in names if len(n) == 9 and n[0] == "c" and n[1:].isdigit())


def load_checkpoint(run_dir: Path, job: RLJob, policy: Policy) -> Position:
    """The newest complete checkpoint, every file's checksum verified (an incomplete or damaged one is skipped,
    said in the run's log)."""
    for version in reversed(checkpoints(run_dir)):
        folder = checkpoint_dir(run_dir, version)
        try:
            return read_checkpoint(folder, job, policy)
        except MemtrainError as exc:
            log_event(run_dir, f"checkpoint {folder.name} skipped: {exc}")
    raise InputError("the run has no complete checkpoint to resume from", path=run_dir / CHECKPOINTS_DIR,
                     hint=f"start it again: memtrain train JOB.toml --run-dir {run_dir} --overwrite")


def read_checkpoint(folder: Path, job: RLJob, policy: Policy) -> Position:
    """One checkpoint directory's position, every file's checksum verified (CorruptFileError naming the file)."""
    meta = unseal(read_json(folder / CHECKPOINT_META, what="checkpoint meta"), path=folder / CHECKPOINT_META,
                  what="checkpoint meta")
    files = meta.get("files", {})
    for name, expected in files.items():
        if checksum_file(folder / name) != expected:
            raise CorruptFileError("checksum mismatch", path=folder / name, expected=expected)
    if meta.get("slots") != job.env.slots:
        raise CorruptFileError("the checkpoint was made for another number of slots", path=folder / CHECKPOINT_META,
                               expected=job.env.slots, found=meta.get("slots"))
    weights = np.array(open_npy(folder / CHECKPOINT_WEIGHTS, shape=(policy.layout.size,), dtype=np.float32))
    state = {name: np.array(open_npy(folder / optimizer_state_name(name), shape=(policy.layout.size,),
                                     dtype=np.float32)) for name in state_names(job.train.optimizer)}
    version = int(meta["version"])
    episodes = [read_state(folder / episode_state_name(slot), job.spaces, version=version, slot=slot)
                for slot in range(job.env.slots)]
    kept = meta.get("pending", [])
    expected = job.env.slots if job.train.staleness and 0 < version <= job.versions else 0
    if not isinstance(kept, list) or len(kept) != expected:
        raise CorruptFileError("the checkpoint does not hold the shards its version learns from (staleness 1)",
                               path=folder / CHECKPOINT_META, expected=f"{expected} shards of version {version - 1}",
                               found=f"{kept!r}")
    pending = [read_shard(shard_path(folder, version - 1, slot), spaces=job.spaces, version=version - 1, slot=slot,
                          seed=job.train.seed, steps=job.env.steps) for slot in range(len(kept))]
    shards = [{"slot": slot, "version": version - 1, "checksum": checksum_file(shard_path(folder, version - 1, slot))}
              for slot in range(len(kept))]
    best = meta.get("best")
    if best is not None and not (isinstance(best, dict) and isinstance(best.get("version"), int)
                                 and isinstance(best.get("eval_return_mean"), int | float)):
        raise CorruptFileError("the checkpoint's best evaluation is not a record", path=folder / CHECKPOINT_META,
                               expected='{"version": V, "eval_return_mean": R} or null', found=repr(best)[:120])
    return Position(version, weights, state, int(meta["step"]), episodes, pending, shards, best)


def _truncate_records(run_dir: Path, version: int) -> None:
    """A resume from ``version``: the lineage keeps its records up to that version, the metrics their lines of the
    versions before it (what came after is made again, the same)."""
    lineage, _ = read_sealed_jsonl(run_dir / RUN_LINEAGE, what="lineage record")
    kept = [seal(r) for r in lineage if isinstance(r.get("version"), int) and r["version"] <= version]
    metrics = [r for r in read_jsonl(run_dir / RUN_METRICS) if r.get("version", math.inf) < version]
    for name, records in ((RUN_LINEAGE, kept), (RUN_METRICS, metrics)):
        path = run_dir / name
        text = "".join(json.dumps(r) + "\n" for r in records)
        publish(path, lambda handle, text=text: handle.write(text.encode()), durable=True)


# --- the loop ---


@dataclass
class RLSummary:
    run_dir: Path
    version: int
    versions: int
    env_steps: int
    seconds: float
    worker_deaths: int
    last: dict[str, Any]


def train_rl(job: RLJob, raw: dict[str, Any], *, resume: bool = False, overwrite: bool = False,
             quiet: bool = False, replaying: tuple[Path, list[dict[str, Any]]] | None = None) -> RLSummary:
    """Run (or resume) ``job`` to its budget; raises MemtrainError (Interrupted on SIGINT/SIGTERM/SIGHUP, after a
    checkpoint)."""
    refuse_unsupported(job, job.source or job.run.dir / RUN_JOB)
    run_dir = Path(job.run.dir)
    stop = StopRequest()
    with on_stop_signals(stop.record), blas_controller().limit(limits=1):
        start_resource_tracker()
        policy = job_policy(job)
        if not resume:
            _create_run(run_dir, raw, policy, overwrite)
        lock = acquire_lock(run_dir)
        try:
            return _run(job, policy, run_dir, stop, resume=resume, quiet=quiet, replaying=replaying)
        except (MemtrainError, OSError) as exc:
            if not isinstance(exc, Interrupted):
                log_event(run_dir, f"failed: {exc}")
            raise
        finally:
            lock.close()


def _start(job: RLJob, policy: Policy, run_dir: Path, resume: bool) -> Position:
    if resume:
        position = load_checkpoint(run_dir, job, policy)
        for later in (v for v in checkpoints(run_dir) if v > position.version):  # skipped as damaged: made again
            shutil.rmtree(checkpoint_dir(run_dir, later))
        _truncate_records(run_dir, position.version)
        for name in os.listdir(run_dir / WEIGHTS_DIR):
            (run_dir / WEIGHTS_DIR / name).unlink()
        publish_params(run_dir, position.version, policy.layout, policy.layout.views(position.weights),
                       made_by="the checkpoint")
        log_event(run_dir, f"resumed at weight version {position.version}")
        return position
    weights = initial_weights(policy, job.train.seed)
    state = {name: np.zeros_like(weights) for name in state_names(job.train.optimizer)}
    checksum = publish_params(run_dir, 0, policy.layout, policy.layout.views(weights), made_by="the initialisation")
    append_jsonl(run_dir / RUN_LINEAGE, seal({"version": 0, "seed": job.train.seed, "checksum": checksum}))
    log_event(run_dir, "started")
    return Position(0, weights, state, 0, [EpisodeState.start(job.spaces) for _ in range(job.env.slots)])


def worker_count(job: RLJob) -> int:
    workers = job.train.workers
    return min(CORES, job.env.slots) if workers == "auto" else int(workers)


def _run(job: RLJob, policy: Policy, run_dir: Path, stop: StopRequest, *, resume: bool, quiet: bool,
         replaying: tuple[Path, list[dict[str, Any]]] | None = None) -> RLSummary:
    from memtrain.rl.worker import RLWorkerState
    from memtrain.train.server.exchange import InServer, WorkerPool

    began = time.monotonic()
    for folder in (run_dir / CHECKPOINTS_DIR, run_dir / TRAJECTORIES_DIR, run_dir / EPISODES_DIR,
                   run_dir / WEIGHTS_DIR):  # what a killed server left under a temporary name
        sweep_orphans(folder, lambda name: True)
    _remove_step_files(run_dir / TRAJECTORIES_DIR)  # what a killed server's learner step left (train.learner)
    position = _start(job, policy, run_dir, resume)
    setup = RLWorkerSetup(server_pid=os.getpid(), run_dir=str(run_dir), blas_threads=job.train.blas_threads)
    workers = 0 if replaying else worker_count(job)  # a replay collects each recorded shard in turn
    stop.deferred = True  # from here a stop signal is recorded, and the run checkpoints where it stands
    transport = WorkerPool(setup, workers, max_starts=job.train.max_attempts) if workers else \
        InServer(RLWorkerState(setup, job, policy, limit=job.train.task_timeout))  # type: ignore[arg-type]
    where = plural(workers, "worker process", "worker processes") if workers else "in the server"
    log_event(run_dir, f"collection: {where}")
    scheduler = Scheduler(task_timeout=job.train.task_timeout, max_attempts=job.train.max_attempts,
                          describe_task=_describe, log=lambda text: log_event(run_dir, text),
                          stop_requested=lambda: stop.requested,
                          discard=lambda task: sweep_orphans(run_dir / TRAJECTORIES_DIR, lambda name: True))
    learner, last = learner_of(job, policy), {}
    # train.learner = "workers": the minibatch gradients' chunks on the workers (with none: the server's, the same bits)
    shares = worker_shares(learner, run_dir, scheduler, transport) if job.rl.learner == "workers" and workers else None
    log_event(run_dir, f"learner: {'the workers' if shares else 'the server'} "
                       f"({plural(job.rl.learner_chunks, 'chunk')} per minibatch)")
    logs = metric_logs(job.run.log_to, run_dir, position.version, kind="version", columns=LOG_COLUMNS)
    recent = deque((r for line in read_jsonl(run_dir / RUN_METRICS) for r in line.get("episode_returns", [])),
                   maxlen=RECENT_EPISODES)  # a resume's: the kept lines' episodes
    try:
        if job.train.mode == "async":
            position, last = _run_async(job, policy, learner, run_dir, scheduler, transport, position, recent, stop,
                                        quiet, replaying, logs)
        while job.train.mode == "sync" and position.version < last_version(job):
            if stop.requested:
                _stopped(job, run_dir, position, stop)
            try:
                position, last = _version(job, policy, learner, run_dir, scheduler, transport, position, recent,
                                          shares)
            except Interrupted:
                _stopped(job, run_dir, position, stop)
            _version_done(job, run_dir, position, last, logs, every=job.run.checkpoint_every)
            if not quiet:
                _progress(job, last)
    finally:
        transport.close()
        for log in logs:
            log.close()
    log_event(run_dir, f"done: weight version {position.version}")
    return RLSummary(run_dir, position.version, job.versions, position.env_steps(job), time.monotonic() - began,
                     scheduler.deaths, last)


def _version_done(job: RLJob, run_dir: Path, position: Position, line: dict[str, Any], logs: list[Any], *,
                  every: int) -> None:
    """After a version's lines (sync or async): the metric logs (``run.log_to``); the best evaluation so far
    (``position.best``: a greedy evaluation return higher than every earlier one); a checkpoint every ``every``
    versions, at the end, and at a new best's version (``run.keep_best``, best-only)."""
    for log in logs:
        log.write(line)
    improved = "eval_version" in line and improves(line.get("eval_return_mean"),
                                                   (position.best or {}).get("eval_return_mean"), "max")
    if improved:
        position.best = {"version": line["eval_version"], "eval_return_mean": line["eval_return_mean"]}
    scheduled = position.version % every == 0 or position.version == last_version(job)
    if scheduled or (improved and job.run.keep_best):
        save_checkpoint(run_dir, job, position, job.run.keep_checkpoints, best_only=not scheduled)


def _run_async(job: RLJob, policy: Policy, learner: Learner, run_dir: Path, scheduler: Scheduler, transport: Any,
               position: Position, recent: deque[float], stop: StopRequest, quiet: bool,
               replaying: tuple[Path, list[dict[str, Any]]] | None, logs: list[Any]) -> tuple[Position, dict[str, Any]]:
    """Async mode (memtrain/rl/asynchronous.py), or the replay of an async run; a checkpoint every
    ``run.checkpoint_every`` x slots versions (a version is one shard) and at the end."""
    held = {"position": position}

    def on_version(now: Position, line: dict[str, Any]) -> None:
        held["position"] = now
        _version_done(job, run_dir, now, line, logs, every=job.run.checkpoint_every * job.env.slots)
        if not quiet and now.version % job.env.slots == 0:
            _progress(job, {**line, "version": now.version // job.env.slots - 1})
        if stop.requested:
            raise Interrupted("stop")

    try:
        if replaying:  # the recorded versions, then a checkpoint where the record ends
            position, last = replay(job, policy, learner, run_dir, transport.state, position, recent, replaying[1],
                                    replaying[0], on_version)
            save_checkpoint(run_dir, job, position, job.run.keep_checkpoints)
            return position, last
        return run_async(job, policy, learner, run_dir, scheduler, transport, position, recent, on_version)
    except Interrupted:
        _stopped(job, run_dir, held["position"], stop)
        raise


def last_version(job: RLJob) -> int:
    """The run's final weight version: one per version's collection, and with staleness 1 one more, the update
    on the last version's shards (version 1 is then version 0's weights: nothing was collected before 0)."""
    if job.train.mode == "async":
        return updates(job)  # one shard per version
    return job.versions + job.train.staleness


def _describe(task: Any) -> str:
    if isinstance(task, GradTask):
        return f"learner task (optimizer step {task.ticket}, chunk {task.task}, of version {task.version}'s update)"
    return f"collection task (version {task.version}, slot {task.task})"


def _remove_step_files(folder: Path) -> None:
    """Every learner step's file in ``folder`` (``layout.is_rl_step_file``): the inputs and each attempt's shares."""
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(folder):
            if is_rl_step_file(name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(folder / name)


def worker_shares(learner: Learner, run_dir: Path, scheduler: Scheduler, transport: Any) -> Shares:
    """``train.learner = "workers"``: each minibatch's chunks but the first as GradTasks run by the workers through
    the scheduler (a worker that dies has its task run again under the next attempt number, which names a new file);
    the first is the server's, computed in a thread beside the scheduler's dispatch (``_Beside``). The step's
    weights and rows go in one file (``rl_step_name``), read by every task; each task's share comes back as float64
    (its float32 gradient exactly, then its loss's parts, ``SHARE_PARTS``). Every file is removed once read."""
    folder = run_dir / TRAJECTORIES_DIR
    size = learner.policy.layout.size

    def shares(minibatch: Minibatch) -> list[LossResult]:
        inputs = folder / rl_step_name(minibatch.step)
        write_step(inputs, minibatch.weights, minibatch.rows)
        tasks = [GradTask(task=chunk, attempt=0, ticket=minibatch.step, version=minibatch.version,
                          epoch=minibatch.epoch, lo=minibatch.lo, hi=minibatch.hi)
                 for chunk in range(1, learner.chunk_count(len(minibatch.rows)))]
        own: list[LossResult] = []

        def first() -> None:  # chunk 0: the server's own, while the workers compute the others
            own.append(learner.share(minibatch.weights, minibatch.rows, 0, minibatch.config))

        try:
            beside = _Beside(first)  # numpy's kernels release the GIL: the share runs beside the dispatch
            try:
                answered = scheduler.run(transport, tasks)
            finally:
                beside.join()
            out = []
            for result in answered:
                path = folder / rl_share_name(minibatch.step, result.task, result.attempt)
                values = np.array(open_npy(path, shape=(size + len(SHARE_PARTS),), dtype=np.float64))
                out.append(LossResult(grad=values[:size].astype(np.float32),
                                      **{name: float(v) for name, v in zip(SHARE_PARTS, values[size:], strict=True)}))
            return own + out
        finally:  # done or stopped (a signal, a failed task): the step's files go, every attempt's (one step at a time)
            _remove_step_files(folder)
    return shares


def _stopped(job: RLJob, run_dir: Path, position: Position, stop: StopRequest) -> None:
    """A stop signal: a checkpoint of where the run stands, then Interrupted (exit 128 + the signal)."""
    save_checkpoint(run_dir, job, position, job.run.keep_checkpoints)
    name = signal.Signals(stop.signum or signal.SIGINT).name
    log_event(run_dir, f"stopped by {name} at weight version {position.version}")
    error = Interrupted(f"stopped by {name} at weight version {position.version}; a checkpoint was written",
                        hint=f"continue with: memtrain train --resume {run_dir}")
    error.exit_code = 128 + (stop.signum or signal.SIGINT)
    raise error


def _version(job: RLJob, policy: Policy, learner: Learner, run_dir: Path, scheduler: Scheduler, transport: Any,
             position: Position, recent: deque[float], shares: Shares | None = None) -> tuple[Position, dict[str, Any]]:
    """Version ``position.version``: collect every slot with it, learn, publish the next version; its metrics line.

    Staleness 0 learns from the shards just collected. Staleness 1 learns from the shards collected with the
    version before (``position.pending``), in a thread of the server while the workers collect with this one
    (the server's own thread keeps dispatching tasks): the update starts from this version's weights, so the
    kept shards are one version old, as DPPO's kept buffers. Each slot's task starts from the episode state its
    previous task left (the collection chain is the same in both modes; only what the learner reads differs).
    """
    version, slots, lag = position.version, job.env.slots, job.train.staleness
    collecting = version < job.versions
    tasks = _collection_tasks(job, run_dir, position) if collecting else []
    overlapped: dict[str, Any] = {}

    def learn_kept() -> None:  # staleness 1: the update on version - 1's shards, while version collects
        if position.pending:
            overlapped["learned"] = learn(learner, position.weights, position.state, position.step, version - 1,
                                          position.pending)

    started = time.monotonic()
    beside = _Beside(learn_kept) if lag else None  # the update beside the dispatch, not in the server's thread
    try:
        if tasks:
            scheduler.run(transport, tasks)
    finally:
        if beside is not None:
            beside.join()
    collected = time.monotonic() - started
    folder = run_dir / TRAJECTORIES_DIR
    trajectories = [read_shard(shard_path(folder, version, slot), spaces=job.spaces, version=version, slot=slot,
                               seed=job.train.seed, steps=job.env.steps) for slot in range(slots)] if collecting else []
    shards = [{"slot": slot, "version": version, "checksum": checksum_file(shard_path(folder, version, slot))}
              for slot in range(slots)] if collecting else []
    episodes = [advance(e, t, job.spaces) for e, t in zip(position.episodes, trajectories, strict=True)] \
        if collecting else position.episodes
    if lag:
        learned, used = overlapped.get("learned"), position.pending_shards
    else:
        learned, used = learn(learner, position.weights, position.state, position.step, version, trajectories,
                              shares), shards
    weights, state, step = (learned.weights, learned.state, learned.step) if learned else \
        (position.weights, position.state, position.step)  # staleness 1, version 0: nothing to learn from yet
    what = f"the {job.rl.algorithm.upper()} update on the shards of version {version - lag}" if learned else \
        "version 0's weights (staleness 1: nothing collected before it)"
    checksum = publish_params(run_dir, version + 1, policy.layout, policy.layout.views(weights), made_by=what)
    fault_point("rl_after_publish")
    line = version_metrics(version, trajectories, learned.batch if learned else None,
                           learned.steps if learned else [])
    returns = [float(r) for t in trajectories for r in t.episode_return[t.done]]
    recent.extend(returns)
    line |= {"episode_returns": returns,
             "return_last100_mean": float(np.mean(recent)) if recent else None}  # over the run's last 100 episodes
    line |= {"kind": "version", "env_steps_total": min(version + 1, job.versions) * slots * job.env.steps,
             "env_steps_per_s": slots * job.env.steps / collected if collecting and collected > 0 else None,
             "lr": learned.lr if learned else None, "learned_from": version - lag if learned else None,
             "policy_lag": lag if learned else None, "seconds": time.monotonic() - started}
    due = job.rl.eval_every and ((version + 1) % job.rl.eval_every == 0 or version + 1 == last_version(job))
    if due:
        returns, lengths = _evaluate(job, policy, weights, version + 1)
        line |= {"eval_version": version + 1, **eval_metrics(returns, lengths)}
    append_jsonl(run_dir / RUN_LINEAGE, seal({"version": version + 1, "parent": version, "shards": used,
                                              "optimizer_steps": step - position.step, "checksum": checksum}))
    append_jsonl(run_dir / RUN_METRICS, line)
    _retire(run_dir, version - lag if learned else None, slots, version + 1 - max(job.run.keep_versions, 1))
    pending, pending_shards = (trajectories, shards) if lag else ([], [])
    return Position(version + 1, weights, state, step, episodes, pending, pending_shards, position.best), line


class _Beside:
    """``work`` run in a thread beside the server's loop; ``join`` waits for it and raises what it raised. The
    update is pure arithmetic on its own arrays, so the thread changes no bit (BLAS is limited process-wide)."""

    def __init__(self, work: Callable[[], None]):
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(work,), name="memtrain-rl-learner", daemon=True)
        self.thread.start()

    def _run(self, work: Callable[[], None]) -> None:
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - handed to the server's thread by join
            self.error = exc

    def join(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def _collection_tasks(job: RLJob, run_dir: Path, position: Position) -> list[CollectTask]:
    """One task per slot at ``position.version``, each from the episode state its slot's previous task left."""
    tasks = []
    for slot, episode in enumerate(position.episodes):
        path = run_dir / EPISODES_DIR / episode_state_name(slot)
        write_state(path, episode, job.spaces, version=position.version, slot=slot)
        tasks.append(CollectTask(task=slot, attempt=0, update=position.version, version=position.version,
                                 episode=episode.episode, step=episode.step, state_key=episode.key()[2].hex(),
                                 state_file=str(path)))
    return tasks


def _evaluate(job: RLJob, policy: Policy, weights: np.ndarray, version: int) -> tuple[np.ndarray, np.ndarray]:
    seed = job.rl.eval_seed if job.rl.eval_seed is not None else job.train.seed

    def act(obs: np.ndarray) -> np.ndarray:
        return policy.greedy(policy.forward(weights, obs))

    return evaluate(act, job.env.spec, job.rl.eval_episodes, seed, version=version)


def _retire(run_dir: Path, learned: int | None, slots: int, old: int) -> None:
    """The shards of version ``learned`` once learned from, and weight version ``old`` (older than the newest
    ``run.keep_versions``)."""
    for slot in range(slots if learned is not None else 0):
        with contextlib.suppress(FileNotFoundError):
            shard_path(run_dir / TRAJECTORIES_DIR, learned, slot).unlink()
    if old >= 0:
        with contextlib.suppress(FileNotFoundError):
            weights_path(run_dir, old).unlink()


def _progress(job: RLJob, line: dict[str, Any]) -> None:
    version = line.get("version", 0) + 1
    if version % max(1, job.versions // 20) and version != job.versions and "eval_version" not in line:
        return
    parts = [f"version {version}/{job.versions}"]
    if line.get("return_mean") is not None:
        parts.append(f"return {line['return_mean']:.1f} ({line['episodes']} episodes)")
    if line.get("eval_return_mean") is not None:
        parts.append(f"eval {line['eval_return_mean']:.1f}")
    if line.get("env_steps_per_s"):
        parts.append(f"{line['env_steps_per_s']:.0f} env steps/s")
    print("memtrain train: " + ", ".join(parts), file=sys.stderr, flush=True)


# --- the command ---


def run_command(args: argparse.Namespace) -> int:
    """``memtrain train`` for an RL job (``JOB.toml`` with ``[env]``) or run (``--resume RUN_DIR``)."""
    if args.replay is not None:
        return _replay_command(args)
    if args.cluster:
        raise InputError("reinforcement learning runs on this machine only, so far", found=f"--cluster {args.cluster}")
    if args.workers is not None and args.workers < 0:
        raise InputError("--workers must be 0 (the server collects alone) or more", found=args.workers)
    if args.resume and args.overrides:
        raise InputError("a reinforcement-learning run resumes with its own job: --set does not apply yet",
                         found=" ".join(args.overrides), hint="--workers N may change the worker count")
    if isinstance(args.resume, str):
        if args.job is not None or args.run_dir is not None:
            raise InputError("give either a job file or --resume RUN_DIR, not both")
        run_dir = Path(args.resume).resolve()
        job = read_run_job(run_dir)
        if args.workers is not None:
            job = _with_workers(job, args.workers)
        raw: dict[str, Any] = {}
        resume = True
    else:
        raw = read_raw(Path(args.job), list(args.overrides), args.workers, args.run_dir)
        job = rl_job_from_dict(raw, base=Path(args.job).resolve().parent, source=Path(args.job))
        run_dir = Path(job.run.dir)
        resume = bool(args.resume)
        if resume and not (run_dir / RUN_JOB).is_file():
            raise InputError("--resume: no run to continue in the job's run directory", path=run_dir)
        if resume:
            job = read_run_job(run_dir) if args.workers is None else _with_workers(read_run_job(run_dir), args.workers)
    if args.overwrite and resume:
        raise InputError("--overwrite and --resume contradict each other")
    try:
        summary = train_rl(job, raw, resume=resume, overwrite=args.overwrite, quiet=args.quiet)
    except MemtrainError as exc:
        from memtrain.train.server.command import _name_resume

        _name_resume(exc, run_dir)  # a failure after the run directory was made says how to continue it
        raise
    print_summary(summary)
    return 0


def _replay_command(args: argparse.Namespace) -> int:
    """``memtrain train --replay RUN`` of an async RL run: its recorded order again, into another run directory."""
    if args.job is not None or args.resume or args.overrides or args.cluster:
        raise InputError("--replay takes a run directory and nothing that changes the job",
                         expected="memtrain train --replay RUN_DIR [--run-dir OUT] [--overwrite]")
    source = Path(args.replay).resolve()
    job = read_run_job(source)
    if job.train.mode != "async":
        raise InputError("--replay re-executes an async run's recorded order; this run is synchronous",
                         path=source, found=f"train.mode = {job.train.mode!r}",
                         hint="a synchronous run gives the same bits when its job runs again, with any worker count")
    lineage, damaged = read_sealed_jsonl(source / RUN_LINEAGE, what="lineage record")
    versions = [r.get("version") for r in lineage]
    if damaged or versions != list(range(len(lineage))) or len(lineage) < 2:
        raise CorruptFileError("the run's lineage cannot be replayed: damaged, or a version is missing",
                               path=source / RUN_LINEAGE, expected="versions 0, 1, 2, ... each sealed",
                               found=f"{len(damaged)} damaged lines, versions {versions[:8]}")
    target = Path(args.run_dir or source.with_name(source.name + "-replay")).resolve()
    if target == source:
        raise InputError("the replay needs its own run directory", path=target, hint="give --run-dir OUT")
    record = unseal(read_json(source / RUN_JOB, what="the run's job record"), path=source / RUN_JOB,
                    what="the run's job record")
    raw = {**record["job"], "run": {**record["job"].get("run", {}), "dir": str(target)}}
    job = rl_job_from_dict(raw, base=target, where=source / RUN_JOB)
    summary = train_rl(job, raw, overwrite=args.overwrite, quiet=args.quiet, replaying=(source, lineage))
    print_summary(summary)
    print(f"replayed {source}: all {len(lineage) - 1} weight versions match the recorded checksums", flush=True)
    return 0


def _with_workers(job: RLJob, workers: int) -> RLJob:
    return dataclasses.replace(job, train=dataclasses.replace(job.train, workers=workers))


def print_summary(summary: RLSummary, out: Callable[[str], None] = print) -> None:
    last = summary.last
    lines = [f"done: {summary.versions} versions ({summary.env_steps:,} env steps), weight version "
             f"{summary.version}, {summary.seconds:.1f} s"]
    if last.get("return_mean") is not None:
        lines.append(f"last version: return mean {last['return_mean']:.2f} over {last['episodes']} episodes")
    if last.get("return_last100_mean") is not None:
        lines.append(f"mean return of the last {RECENT_EPISODES} episodes: {last['return_last100_mean']:.2f}")
    if last.get("eval_return_mean") is not None:
        lines.append(f"evaluation (greedy, version {last['eval_version']}): return mean {last['eval_return_mean']:.2f}")
    if summary.worker_deaths:
        lines.append(f"workers that died and were replaced: {summary.worker_deaths}")
    lines.append(f"run directory: {summary.run_dir}")
    lines.append(f"inspect it with: memtrain inspect {summary.run_dir}")
    out("\n".join(lines))
