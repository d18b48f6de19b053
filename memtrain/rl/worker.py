"""A worker of a reinforcement-learning run: CollectTasks in, Results out (train/worker/worker.py starts it when its
setup is an ``RLWorkerSetup``; the server runs the same state itself with 0 workers).

The worker reads the run's job (``job.json``) once, makes the policy, and keeps the live environments of the
slots it stepped (``SlotCache``): a task whose slot state matches one is continued at once, any other is
re-simulated from the slot's state file (memtrain/rl/collect.py). Which worker runs which slot never changes a bit.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from memtrain.layout import EPISODES_DIR, TRAJECTORIES_DIR, episode_state_name, weights_path
from memtrain.rl.asynchronous import a3c_gradient, is_a3c
from memtrain.rl.collect import SlotCache, blas_controller, collect, read_state
from memtrain.rl.config import RLJob
from memtrain.rl.trajectory import gradient_path
from memtrain.train.messages import CollectTask, GradTask, Outcome, Result, RLWorkerSetup


class RLWorkerState:
    """What a worker keeps between collection tasks: the job, the policy, the live environments."""

    def __init__(self, setup: RLWorkerSetup, job: RLJob | None = None, policy: object | None = None, *,
                 limit: float | None = None):
        """``limit``: seconds a run of a task may take (the server's own tasks, 0 workers: train.task_timeout;
        a worker process's are watched by the scheduler)."""
        from memtrain.rl.server import job_policy, read_run_job

        self.setup, self.limit = setup, limit
        self.run_dir = Path(setup.run_dir)
        self.job = job if job is not None else read_run_job(self.run_dir)
        self.policy = policy if policy is not None else job_policy(self.job)
        self.cache = SlotCache()
        if self.job.model.kind == "torch" and policy is None:  # a worker process: torch on its BLAS threads, as
            import torch  # every worker runs one task at a time (N workers x all-core torch oversubscribe)

            torch.set_num_threads(setup.blas_threads)

    def handle(self, message: CollectTask | GradTask) -> Result:
        from memtrain.train.worker.worker import error_text

        started = time.perf_counter()
        try:
            with np.errstate(all="ignore"):
                if isinstance(message, GradTask):
                    self.share(message)
                else:
                    self.collect(message)
        except BaseException as exc:  # noqa: BLE001 - an environment is user code: reported, the server stops the run
            return Result(task=message.task, attempt=message.attempt, outcome=Outcome.FAILED, error=error_text(exc))
        return Result(task=message.task, attempt=message.attempt, outcome=Outcome.DONE, rows=self.job.env.steps,
                      seconds=time.perf_counter() - started)

    def collect(self, task: CollectTask) -> None:
        job = self.job
        state = read_state(Path(task.state_file) if task.state_file else
                           self.run_dir / EPISODES_DIR / episode_state_name(task.task), job.spaces,
                           version=task.version, slot=task.task)
        if (state.episode, state.step, state.key()[2].hex()) != (task.episode, task.step, task.state_key):
            from memtrain.errors import CorruptFileError

            raise CorruptFileError("the slot's episode state is not the one the task was sent for",
                                   path=task.state_file, expected=f"episode {task.episode}, step {task.step}",
                                   found=f"episode {state.episode}, step {state.step}")
        done = collect(weights_path(self.run_dir, task.version), task.version, task.task, job.env.spec,
                       job.train.seed, job.env.steps, state, out_dir=self.run_dir / TRAJECTORIES_DIR, cache=self.cache,
                       attempts=job.train.max_attempts, policy=self.policy, limit=self.limit)
        if is_a3c(job):  # A3C: the task's own actor-critic gradient, at the version it collected with
            from memtrain.files import open_npy, publish_array
            from memtrain.rl.server import learner_of

            weights = open_npy(weights_path(self.run_dir, task.version), dtype=np.float32)
            with blas_controller().limit(limits=1):
                grad = a3c_gradient(job, learner_of(job, self.policy), np.asarray(weights), done.trajectory)
            publish_array(gradient_path(self.run_dir / TRAJECTORIES_DIR, task.version, task.task), grad,
                          durable=False)

    def share(self, task: GradTask) -> None:
        """A learner task (``train.learner = "workers"``): chunk ``task.task``'s share of optimizer step
        ``task.ticket``'s minibatch gradient, from the step's inputs, published as one float64 file (the gradient,
        then its loss's parts)."""
        from memtrain.faults import fault_point
        from memtrain.files import publish_array
        from memtrain.layout import rl_share_name, rl_step_name
        from memtrain.rl.learner import SHARE_PARTS, read_step
        from memtrain.rl.server import learner_of

        folder = self.run_dir / TRAJECTORIES_DIR
        weights, rows = read_step(folder / rl_step_name(task.ticket))
        learner = learner_of(self.job, self.policy)
        config, _ = learner.config_at(task.version)
        with blas_controller().limit(limits=1):
            share = learner.share(weights, rows, task.task, config)
        fault_point("rl_mid_share")
        values = np.concatenate([share.grad.astype(np.float64), [getattr(share, name) for name in SHARE_PARTS]])
        publish_array(folder / rl_share_name(task.ticket, task.task, task.attempt), values, durable=False)

    def close(self) -> None:
        self.cache.close()
