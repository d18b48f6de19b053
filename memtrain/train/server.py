"""A job -> a trained run: publish a version, post tasks, collect, reduce in task order, step, log, checkpoint."""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.config import Job
from memtrain.dataset import Dataset, open_dataset
from memtrain.errors import Interrupted, MemtrainError, plural
from memtrain.faults import fault_point
from memtrain.files import open_npy, read_jsonl
from memtrain.layout import RUN_METRICS, STEP_MARKS, gradient_name
from memtrain.progress import reporting
from memtrain.stopping import on_stop_signals, start_resource_tracker
from memtrain.train.advice import few_updates_note
from memtrain.train.context import ModelContext, model_context, startup_check
from memtrain.train.counters import batch_number, epoch_number, position_text, update_number
from memtrain.train.datacheck import check_trainable
from memtrain.train.exchange import WorkerPool
from memtrain.train.marks import create_marks
from memtrain.train.messages import Building, EvalTask, GradTask, Result, StatsTask, StepTask, Task, WorkerSetup
from memtrain.train.metrics import SHOWN
from memtrain.train.metrics import collect as validation_metrics
from memtrain.train.optim import learning_rate
from memtrain.train.plan import Update, epoch_updates, eval_tasks, split_range, updates_per_epoch
from memtrain.train.record import Decision
from memtrain.train.room import room_needed
from memtrain.train.run_dir import RunDir, open_run_dir, refuse_live_run
from memtrain.train.scheduler import Scheduler
from memtrain.train.state import Position, resume, save_checkpoint, start_fresh
from memtrain.train.weights import (
    BLOCK,
    begin_weights,
    block_count,
    commit_weights,
    create_digests,
    discard,
    publish_weights,
    retire_weights,
    weights_checksum,
)

# Checksum blocks per reduce slice below which one worker does the whole reduction: under ~256K floats
# the per-task round trip costs more than the parallel add saves.
MIN_SLICE_BLOCKS = 4


@dataclass(frozen=True)
class Collected:
    """An update whose gradients are in (at ``version``) and whose step is not done yet."""

    update: Update
    version: int
    index: int  # the update's number in the run
    names: tuple[str, ...]  # its gradient files, in task order
    loss: float
    compute_s: float  # the slowest task's compute time


@dataclass
class TrainSummary:
    """What ``memtrain.fit`` (and ``memtrain train``) returns: where the run is and how it ended.

    ``final`` and ``best`` are epoch records as in ``metrics.jsonl`` (``val_loss``, ``val_accuracy``, ...);
    ``best`` is the epoch with the lowest ``val_loss``; ``epochs`` counts the epochs done.
    """

    run_dir: Path
    version: int
    epochs: int
    final: dict[str, Any]
    best: dict[str, Any] | None
    seconds: float
    worker_deaths: int
    stopped_early: bool = False  # by train.patience


def train(job: Job, *, resume_run: bool = False, verify: bool = False, overwrite: bool = False,
          asked: Collection[str] = (), quiet: bool = False) -> TrainSummary:
    """Run (or resume) a job to the end; raises MemtrainError (Interrupted on SIGINT/SIGTERM/SIGHUP).

    ``asked``: the ``section.key`` settings named on the command line, the only ones a resume may change.
    ``quiet``: no progress bar and no epoch lines (warnings are still printed).
    """
    stop = StopRequest()
    with on_stop_signals(stop.record):
        start_resource_tracker()
        refuse_live_run(job.run.dir)
        dataset = open_dataset(job.data.path, verify=verify or job.data.verify)
        check_trainable(dataset)
        context = model_context(dataset, job.model.kind, job.model.options, job.data.normalize)
        runtime = startup_check(context, dataset, job.train.blas_threads)  # a model's dry run: its errors exit 2 here
        note = few_updates_note(job, dataset.split("train").rows, context.additive)
        if note is not None:
            print(f"memtrain train: note: {note}", file=sys.stderr, flush=True)
        room = room_needed(job, context)  # every file the run will write, at its peak
        run = open_run_dir(job, resume=resume_run, overwrite=overwrite, layout=context.layout.to_json(),
                           asked=asked, one_pass=context.additive, need_exchange=room.exchange, need_run=room.run)
        try:
            if runtime:
                run.event(runtime)
            return Trainer(job, dataset, context, run, stop, quiet=quiet).run(run.decision)
        except (MemtrainError, OSError) as exc:
            if not isinstance(exc, Interrupted):  # the run's log tells how it ended, even with no terminal
                run.event(f"failed: {exc}")
            raise
        finally:
            run.close()


@dataclass
class StopRequest:
    """Set by SIGINT/SIGTERM/SIGHUP.

    Until training starts (``deferred`` False) a stop raises at once, wherever start-up is (opening or
    verifying the dataset, measuring the exchange): there is nothing to save yet, and every step of it
    cleans up after itself. From then on a stop is only recorded; the scheduler checks it while waiting,
    so it never lands mid-bookkeeping, and the run checkpoints where it stands.
    """

    signum: int | None = None
    deferred: bool = False

    def record(self, signum: int) -> None:
        self.signum = self.signum or signum
        if not self.deferred:
            self.deferred = True  # a second signal during the unwinding must not interrupt the cleanup
            error = Interrupted(f"stopped by {signal.Signals(signum).name} during start-up, before training began",
                                hint="nothing was trained; run the same command again to start")
            error.exit_code = 128 + signum
            raise error

    def check(self) -> None:
        if self.signum is not None:
            name = signal.Signals(self.signum).name
            raise Interrupted(f"stopped by {name}")


class Trainer:
    def __init__(self, job: Job, dataset: Dataset, context: ModelContext, run: RunDir, stop: StopRequest, *,
                 quiet: bool = False):
        self.job, self.dataset, self.context, self.run_dir, self.stop = job, dataset, context, run, stop
        self.quiet = quiet
        self.train_rows = dataset.split("train").rows
        self.val_rows = dataset.split("val").rows
        self.per_epoch = updates_per_epoch(self.train_rows, job.train.batch_size)
        self.total_updates = self.per_epoch * job.train.epochs
        self.checkpointed: int | None = None
        self.started = time.monotonic()
        self.next_file: Path | None = None  # an unpublished weight file of the right size, made ready in advance
        self.digests = create_digests(run.exchange, context.layout.size)
        create_marks(run.exchange / STEP_MARKS, job.train.workers)
        self.seq = 0  # steps so far; each slice owner marks its slice with its step's number
        self.unwritten: list[tuple[str, dict[str, Any]]] = []  # log records kept off the critical path

    def run(self, decision: Decision | None) -> TrainSummary:
        """``decision``: what a resume was allowed to change; None for a new run."""
        self.stop.deferred = True  # from here a stop checkpoints where the run stands
        if self.stop.signum is not None:
            raise Interrupted(f"stopped by {signal.Signals(self.stop.signum).name} during start-up")
        position = (resume(self.run_dir, self.job, self.context, self.train_rows, decision) if decision is not None
                    else start_fresh(self.run_dir, self.job, self.context))
        self.checkpointed = position.update_index(self.per_epoch) if decision is not None else None
        pool = WorkerPool(self._setup(), self.job.train.workers)
        self.log(f"server pid {os.getpid()}; workers started: pids {' '.join(map(str, pool.pids()))}")
        scheduler = Scheduler(pool, task_timeout=self.job.train.task_timeout,
                              max_attempts=self.job.train.max_attempts, describe=self.describe,
                              log=self.log, check_stop=self.stop.check, discard=self.discard_attempt)
        try:
            last = self._fit(scheduler, position) or self._last_epoch_record()
        except (KeyboardInterrupt, Interrupted) as exc:
            pool.close(timeout=2.0)
            raise self._interrupted(position, exc) from None
        finally:
            self.write_logs()
            pool.close()
            if self.next_file is not None:
                discard(self.next_file)
        self.log(f"done: {position.epoch} epochs, weight version {position.version}")
        return TrainSummary(self.run_dir.path, position.version, position.epoch, last, position.best,
                            time.monotonic() - self.started, scheduler.deaths,
                            stopped_early=position.epoch < self.job.train.epochs and self.out_of_patience(position))

    def _fit(self, scheduler: Scheduler, position: Position) -> dict[str, Any]:
        last: dict[str, Any] = {}
        if self.context.additive and position.version == 0:
            self.fit_additive(scheduler, position)
            return self.end_epoch(scheduler, position, time.monotonic(), final=True)
        for epoch in range(position.epoch, self.job.train.epochs):
            if self.out_of_patience(position):  # a resumed run that had stopped early
                break
            started = time.monotonic()
            updates = epoch_updates(self.train_rows, self.job.train.batch_size, self.job.train.tasks_per_update,
                                    self.job.train.seed, epoch)
            with reporting(f"epoch {epoch + 1}/{self.job.train.epochs}", len(updates),
                           plain_every=math.inf, quiet=self.quiet) as bar:
                collected = None
                for update in updates[position.batch:]:
                    collected = self.update(scheduler, update, position, collected)
                    rate = position.epoch_rows / max(time.monotonic() - started, 1e-9)
                    bar.update(position.batch, f"loss {position.epoch_loss / max(position.epoch_rows, 1):.4f}"
                                               f"  {rate:,.0f} samples/s")
                if collected is not None:
                    self.step_alone(scheduler, position, collected)
                last = self.end_epoch(scheduler, position, started, final=epoch + 1 == self.job.train.epochs)
                line = self.epoch_line(last)
                self.log(line)  # the run's own record: the console may be gone (a closed terminal or pipe)
                bar.line(line)
        return last

    def update(self, scheduler: Scheduler, update: Update, position: Position,
               previous: Collected | None) -> Collected | None:
        """The gradients of ``update`` -- in the same round as the step of ``previous``, when there is one.

        Returns ``update`` collected (its step is done by the next round), or None when its gradients
        were not finite and it was skipped.
        """
        results = self.fused_round(scheduler, update, position, previous) if previous is not None else None
        if results is None:  # no step pending, or the pending one was void: gradients at the published version
            version = position.version
            results = scheduler.run([GradTask(t.index, 0, version, t.lo, t.hi) for t in update.tasks],
                                    while_waiting=lambda: self.meanwhile(version))
        collected = Collected(update, position.version, position.update_index(self.per_epoch),
                              tuple(gradient_name(position.version, r.task, r.attempt) for r in results),
                              sum(r.loss for r in results), max(r.seconds for r in results))
        bad = [t for t, r in zip(update.tasks, results, strict=True) if not r.finite]
        if bad:
            self.finish(position, collected, published=False, bad=bad)
            return None
        return collected

    def fused_round(self, scheduler: Scheduler, update: Update, position: Position,
                    previous: Collected) -> list[Result] | None:
        """One dispatch round: each worker steps its slice of ``previous`` into the next version, waits
        for the other slices, then computes its gradient of ``update`` at that version.

        Returns the gradient results; None when the step came out non-finite (``previous`` is then
        skipped, or the run stops, per ``train.on_nonfinite``, and no gradient was computed: every
        waiter saw the void mark first).
        """
        version = previous.version
        steps = self.step_tasks(previous, len(update.tasks))
        building = Building(steps[0].out, steps[0].seq, len(steps), self.job.train.task_timeout / 2)
        grads = [GradTask(t.index, 0, version + 1, t.lo, t.hi, steps[i] if i < len(steps) else None, building)
                 for i, t in enumerate(update.tasks)]
        return self.step_round(scheduler, position, previous, steps, grads, lambda: self.meanwhile(version))

    def step_alone(self, scheduler: Scheduler, position: Position, previous: Collected) -> None:
        """The step of the epoch's last update, in a round of its own (evaluation needs the new version)."""
        steps = self.step_tasks(previous, len(previous.update.tasks))
        self.step_round(scheduler, position, previous, steps, steps, self.write_logs)

    def step_round(self, scheduler: Scheduler, position: Position, previous: Collected, steps: list[StepTask],
                   tasks: list[Task], while_waiting: Callable[[], None]) -> list[Result] | None:
        """Run ``tasks`` (which carry ``steps``), then publish the new version or skip ``previous``.

        Returns the results, or None when a slice of the step was not finite.
        """
        try:
            results = scheduler.run(tasks, while_waiting)
            fault_point("mid_reduce")
            published = all(r.step_finite and not r.new_version_void for r in results)
            if published:
                self.publish(previous, steps)
        finally:
            discard(Path(steps[0].out))
        self.finish(position, previous, published=published)
        return results if published else None

    def step_tasks(self, previous: Collected, tasks: int) -> list[StepTask]:
        """The slices of the step after ``previous``, into the version file made ready in advance."""
        version = previous.version
        self.prepare_next_version(version)
        out, self.next_file = str(self.next_file), None
        self.seq += 1
        lr = learning_rate(self.job.train.optimizer, previous.index, self.total_updates)
        return [StepTask(i, 0, version, version + 1, lr, previous.update.rows, version % 2, lo, hi, previous.names,
                         out, self.seq)
                for i, (lo, hi) in enumerate(self.step_slices(self.context.layout.size, tasks))]

    def publish(self, previous: Collected, tasks: list[StepTask]) -> None:
        first = tasks[0]
        checksum = weights_checksum(self.digests, self.context.layout.size)
        commit_weights(Path(first.out), self.run_dir.path, first.version + 1)
        update = previous.update
        self.unwritten.append(("lineage", {
            "version": first.version + 1, "parent": first.version, "update": update_number(previous.index),
            "epoch": epoch_number(update.epoch), "batch": batch_number(update.batch), "split": "train",
            "tasks": [[t.lo, t.hi] for t in update.tasks], "lr": first.lr,
            "checksum": checksum}))

    def finish(self, position: Position, collected: Collected, *, published: bool,
               bad: list[Any] | None = None) -> None:
        """Account for an update whose step was published or skipped, and delete its gradient files."""
        update = collected.update
        if not published:
            bad = bad or self.nonfinite_gradients(update, collected.names)
        for name in collected.names:
            (self.run_dir.exchange / name).unlink(missing_ok=True)
        if not published:
            self.nonfinite(update, collected.index, bad)
            position.skipped += 1
        else:
            position.version += 1
        position.epoch_loss += collected.loss
        position.epoch_rows += update.rows
        position.batch += 1
        self.unwritten.append(("metric", {
            "kind": "update", "epoch": epoch_number(update.epoch), "batch": batch_number(update.batch),
            "update": update_number(collected.index),
            "version": position.version, "loss": collected.loss / update.rows, "rows": update.rows,
            "skipped": not published, "compute_s": collected.compute_s, "time": time.time()}))

    def discard_attempt(self, task: Task) -> None:
        """Delete the gradient or statistics file a dead or superseded attempt may have published."""
        if isinstance(task, GradTask | StatsTask):
            version = task.version if isinstance(task, GradTask) else 0
            (self.run_dir.exchange / gradient_name(version, task.task, task.attempt)).unlink(missing_ok=True)

    def meanwhile(self, version: int) -> None:
        """The server's own work while the workers compute at ``version`` (or build the one after it)."""
        self.write_logs()
        self.prepare_next_version(version)

    def write_logs(self) -> None:
        """Append the lineage and metric records of the updates finished since the last call.

        Kept off the path between two rounds: they are written while the next round computes, and
        always before an epoch's record, a checkpoint or the end of the run. A crash in between loses
        only records that resume rewrites anyway (it truncates the logs to its checkpoint).
        """
        for kind, record in self.unwritten:
            getattr(self.run_dir, kind)(record)
        self.unwritten.clear()

    def prepare_next_version(self, version: int) -> None:
        """Retire versions beyond ``keep_versions`` and make the (unpublished) file of ``version + 1`` ready.

        Called while the workers compute the gradients at ``version``: no task of a retired version is
        still running then, so the newest retired file is recycled as the next version's file. A no-op
        while a file is ready: ``step`` takes it, and nothing new is published until it does.
        """
        if self.next_file is not None:
            return
        spare = retire_weights(self.run_dir.path, self.job.run.keep_versions, version, recycle=True)
        self.next_file = begin_weights(self.run_dir.path, version + 1, self.context.layout.size, spare)

    def step_slices(self, size: int, tasks: int) -> list[tuple[int, int]]:
        """One parameter slice per worker (fewer for small models, or when an update has fewer tasks, since
        in a fused round each slice rides with a gradient task), each a whole number of checksum blocks."""
        blocks = block_count(size)
        parts = min(self.job.train.workers, tasks, max(1, blocks // MIN_SLICE_BLOCKS))
        return [(a * BLOCK, min(b * BLOCK, size)) for a, b in split_range(0, blocks, parts)]

    def nonfinite_gradients(self, update: Update, names: tuple[str, ...]) -> list[Any]:
        """The tasks whose gradient file holds NaN/Inf (read only on this rare path, never per update)."""
        size = self.context.layout.size
        return [task for task, name in zip(update.tasks, names, strict=True)
                if not np.isfinite(open_npy(self.run_dir.exchange / name, shape=(size,), dtype=np.float32)).all()]

    def nonfinite(self, update: Update, index: int, bad: list[Any]) -> None:
        where = ", ".join(f"task {t.index} ({self.describe_rows(t.lo, t.hi)})" for t in bad) or \
            "the mean gradient or the new weights (each task's gradient was finite)"
        text = (f"non-finite loss or gradient at update {update_number(index)} (epoch {epoch_number(update.epoch)}, "
                f"batch {batch_number(update.batch)}): {where}")
        if self.job.train.on_nonfinite == "stop":
            raise MemtrainError(text, hint="lower train.lr, check the data, or set train.on_nonfinite = \"skip\"; "
                                           "the published weights are unchanged")
        self.log(text + "; update skipped")

    def fit_additive(self, scheduler: Scheduler, position: Position) -> None:
        """Additive models: one pass of sufficient statistics, summed in task order, then solved."""
        pieces = split_range(0, self.train_rows, self.job.train.tasks_per_update)
        results = scheduler.run([StatsTask(i, 0, lo, hi) for i, (lo, hi) in enumerate(pieces)])
        layout = self.context.stats_layout
        total = np.zeros(layout.size, dtype=np.float64)
        for result in results:
            path = self.run_dir.exchange / gradient_name(0, result.task, result.attempt)
            total += open_npy(path, shape=(layout.size,), dtype=np.float64)
            path.unlink()
        params = self.context.model.solve(layout.views(total))
        checksum = publish_weights(self.run_dir.path, 1, self.context.layout.flatten(params))
        self.run_dir.lineage({"version": 1, "parent": 0, "update": 1, "epoch": 1, "split": "train",
                              "tasks": [list(p) for p in pieces], "solve": self.job.model.kind, "checksum": checksum})
        position.version, position.epoch_rows = 1, self.train_rows
        position.epoch = self.job.train.epochs - 1

    def end_epoch(self, scheduler: Scheduler, position: Position, started: float, *, final: bool) -> dict[str, Any]:
        self.write_logs()
        def retire() -> None:  # so that the run holds keep_versions versions whenever it stops after this
            if not self.context.additive:
                self.prepare_next_version(position.version)

        record = {"kind": "epoch", "epoch": position.epoch + 1, "update": (position.epoch + 1) * self.per_epoch,
                  "version": position.version, "loss": position.epoch_loss / max(position.epoch_rows, 1),
                  **self.evaluate(scheduler, position.version, while_waiting=retire),
                  "samples_per_s": position.epoch_rows / max(time.monotonic() - started, 1e-9), "time": time.time()}
        retire()
        if self.context.additive:
            record["loss"] = None  # one closed-form solve: there is no running training loss
        self.run_dir.metric(record)
        improved = position.best is None or record.get("val_loss", math.inf) < position.best.get("val_loss", math.inf)
        if improved:
            position.best = record
        position.epoch, position.batch, position.epoch_loss, position.epoch_rows = position.epoch + 1, 0, 0.0, 0
        if self.out_of_patience(position):
            self.log(f"stopping early: no better val_loss for {plural(self.job.train.patience, 'epoch')} "
                     f"(best: epoch {position.best['epoch']})")
            final = True
        if final or position.epoch % self.job.run.checkpoint_every == 0 or (improved and self.job.run.keep_best):
            save_checkpoint(self.run_dir, self.job, self.context, position, self.per_epoch, record)
            self.checkpointed = position.update_index(self.per_epoch)
        return record

    def out_of_patience(self, position: Position) -> bool:
        """Early stopping: ``train.patience`` epochs have passed since the one with the best val_loss."""
        patience, best = self.job.train.patience, position.best
        return patience is not None and best is not None and "val_loss" in best and \
            position.epoch - best["epoch"] >= patience

    def evaluate(self, scheduler: Scheduler, version: int,
                 while_waiting: Callable[[], None] | None = None) -> dict[str, float]:
        tasks = eval_tasks(self.val_rows, self.job.train.eval_rows)
        if not tasks:
            return {}
        results = scheduler.run([EvalTask(t.index, 0, version, t.lo, t.hi) for t in tasks], while_waiting)
        rows = sum(r.rows for r in results)
        metrics = {"val_loss": sum(r.loss for r in results) / rows}
        if self.context.classifier:
            metrics["val_accuracy"] = sum(r.correct for r in results) / rows
        return metrics | validation_metrics(self.run_dir.exchange, version, results, self.context)

    def epoch_line(self, record: dict[str, Any]) -> str:
        parts = [f"epoch {record['epoch']}/{self.job.train.epochs}"]
        if record["loss"] is not None:
            parts.append(f"loss {record['loss']:.4f}")
        parts += [f"{key} {record[key]:.4f}" for key in SHOWN if key in record]
        parts.append(f"{record['samples_per_s']:,.0f} samples/s")
        return "  ".join(parts)

    def _interrupted(self, position: Position, exc: BaseException) -> Interrupted:
        self.write_logs()
        index = position.update_index(self.per_epoch)
        if self.checkpointed != index and position.version > 0:
            save_checkpoint(self.run_dir, self.job, self.context, position, self.per_epoch)
        signum = self.stop.signum or signal.SIGINT  # KeyboardInterrupt: SIGINT outside our handler
        name = signal.Signals(signum).name
        where = position_text(position.epoch, position.batch, self.per_epoch)
        error = Interrupted(f"stopped by {name} {where} (weight version {position.version}); the newest "
                            "checkpoint is intact", hint=f"resume with: memtrain train --resume {self.run_dir.path}")
        error.exit_code = 128 + signum
        self.run_dir.event(f"interrupted by {name} {where} (weight version {position.version})")
        return error

    def _last_epoch_record(self) -> dict[str, Any]:
        """When a resumed run has nothing left to do, its summary is the last epoch it logged."""
        epochs = [r for r in read_jsonl(self.run_dir.path / RUN_METRICS) if r.get("kind") == "epoch"]
        return epochs[-1] if epochs else {}

    def describe(self, task: Task) -> str:
        kind = {GradTask: "gradient", StatsTask: "statistics", EvalTask: "evaluation", StepTask: "reduce/step"}
        name = kind.get(type(task), "task")
        if isinstance(task, StepTask):
            return f"{name} task {task.task} (parameters {task.lo}-{task.hi}, version {task.version})"
        split = "val" if isinstance(task, EvalTask) else "train"
        text = f"{name} task {task.task} ({self.describe_rows(task.lo, task.hi, split)})"
        if isinstance(task, GradTask) and task.slice is not None:
            text += f", after its step slice (parameters {task.slice.lo}-{task.slice.hi}, version {task.version})"
        return text

    def describe_rows(self, lo: int, hi: int, split: str = "train") -> str:
        shards = self.dataset.split(split).segments(lo, hi)
        names = ", ".join(self.dataset.split(split).shards[s].x_path.name for s, _, _ in shards)
        return f"rows {lo}-{hi} of the {split} split, shard {names}"

    def log(self, text: str) -> None:
        self.run_dir.event(text)

    def _setup(self) -> WorkerSetup:
        optimizer = tuple((f.name, getattr(self.job.train.optimizer, f.name))
                          for f in dataclasses.fields(self.job.train.optimizer))
        return WorkerSetup(os.getpid(), str(self.run_dir.path), str(self.run_dir.exchange), str(self.dataset.path),
                           self.job.data.normalize, self.job.model.kind, tuple(self.job.model.options.items()),
                           self.job.train.blas_threads, optimizer, 0, self.job.train.seed)
