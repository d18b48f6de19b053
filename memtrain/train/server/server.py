"""A job -> a trained run: the epoch loop (``Trainer.fit``), each epoch run by the engine chosen once at start.

The run's engine is chosen once at start (train/server/choice.py, one table), then made with its placement
(``Trainer.choose``, the reasons logged), one of train/server/engines.py's: the rounds (workers meeting at marks,
each stepping a slice; or the server alone), the cluster's rounds, the desk (async mode on worker processes), the
server stepping the whole vector (train/loops/overlap.py; a replay, train/server/replay.py) or an additive model's
pass and solve (train/server/onepass.py). The epoch loop calls ``engine.run(position)`` until the engine says the
epoch is done and never names a mode. The server watches the engine's workers (train/server/scheduler.py), logs
what finished (train/records/logbook.py), evaluates each epoch's last version, checkpoints and stops cleanly on a
signal. When it runs the rounds itself, it does its chores between two updates (``stretch_chores``)."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from memtrain.config import Job
from memtrain.dataset import Dataset, open_dataset
from memtrain.errors import Interrupted, MemtrainError, plural
from memtrain.files import allocate_npy, open_npy, read_jsonl
from memtrain.layout import (
    RUN_METRICS,
    weights_path,
)
from memtrain.progress import reporting
from memtrain.records import METRICS_EPOCH, make
from memtrain.stopping import StopRequest, on_stop_signals, start_resource_tracker
from memtrain.train.context import ModelContext, startup_check
from memtrain.train.exchange.area import BOARD, GRADIENT_BUFFER, METRICS, RECORDS, discard
from memtrain.train.exchange.marks import (
    Board,
    create_records,
    open_records,
)
from memtrain.train.exchange.weights import (
    create_digests,
    discard_building,
    retire_weights,
    unpublish_after,
    versions_to_keep,
)
from memtrain.train.memory import size_text
from memtrain.train.messages import (
    BackupRule,
    EvalTask,
    GradTask,
    RoundSetup,
    StatsTask,
    StepTask,
    Task,
    WorkerSetup,
)
from memtrain.train.optim import state_names
from memtrain.train.plan import Plan, RowWords, eval_tasks
from memtrain.train.records.checkpoint import StagedBest
from memtrain.train.records.counters import ONE_PASS, position_text, update_number
from memtrain.train.records.lineage import Lineage
from memtrain.train.records.logbook import Chores, Logbook
from memtrain.train.records.metrics import SHOWN
from memtrain.train.records.metrics import collect as validation_metrics
from memtrain.train.records.record import Decision
from memtrain.train.records.run_dir import RunDir, beside_earlier, open_run_dir, refuse_live_run
from memtrain.train.records.state import (
    Position,
    commit_best,
    resume,
    save_checkpoint,
    stage_best,
    start_fresh,
)
from memtrain.train.server.choice import Choice, choose
from memtrain.train.server.datacheck import check_trainable
from memtrain.train.server.engines import EngineContext, EpochEngine
from memtrain.train.server.exchange import InServer, WorkerPool
from memtrain.train.server.monitor import check_monitor, monitor_for
from memtrain.train.server.outline import server_context
from memtrain.train.server.placement import (
    Placement,
    ServerThreads,
    stream_workers,
    thread_candidates,
    worker_start_cost,
)
from memtrain.train.server.pools import OnCluster, Streamed, check_cluster, open_cluster
from memtrain.train.server.room import allow_open_files, room_needed
from memtrain.train.server.scheduler import CORES, Scheduler
from memtrain.train.server.summary import summary_html, summary_text
from memtrain.train.timing import UNTIMED, Timer, timed, timed_sections
from memtrain.train.worker.worker import WorkerState


@dataclass(repr=False)
class TrainSummary:
    """What ``memtrain.fit`` (and ``memtrain train``) returns: where the run is and how it ended.

    ``final`` and ``best`` are epoch records as in ``metrics.jsonl`` (``val_loss``, ``val_accuracy``, ...);
    ``best`` is the best epoch by ``train.monitor`` (lowest ``val_loss`` by default); ``epochs`` counts the
    epochs done. ``one_pass``: an additive model, fitted in one pass of statistics and a solve, so it has no
    epochs to report. ``str(summary)`` (and a notebook's display) is a short table.
    """

    run_dir: Path
    version: int
    epochs: int
    final: dict[str, Any]
    best: dict[str, Any] | None
    seconds: float
    worker_deaths: int
    stopped_early: bool = False  # by train.patience
    one_pass: bool = False  # an additive model: one pass of statistics, then a solve; ``epochs`` says nothing
    monitor: str = "val_loss"  # the metric that chose ``best`` (train.monitor)

    def __str__(self) -> str:
        return summary_text(self)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        return summary_html(self)


def train(job: Job, *, resume_run: bool = False, verify: bool = False, overwrite: bool = False,
          asked: Collection[str] = (), quiet: bool = False, replay: Lineage | None = None,
          callbacks: Sequence[Any] = (), say: Callable[[str], None] | None = None,
          timer: Timer = UNTIMED) -> TrainSummary:
    """Run (or resume) a job to the end; raises MemtrainError (Interrupted on SIGINT/SIGTERM/SIGHUP).

    ``asked``: the ``section.key`` settings named on the command line, the only ones a resume may change.
    ``quiet``: no progress bar, no epoch lines and no notes (warnings are still printed; a note is also in the
    run's event log). ``say``: how a note is shown (default: ``memtrain train: note: ...`` on stderr, its
    advice in command-line terms; ``memtrain.fit`` says it in Python terms). ``replay``: the lineage of
    the run ``job`` made, to run again exactly (train/loops/overlap.py) instead of the job's epochs. ``callbacks``:
    called at the end of each epoch (train/server/monitor.py). ``timer``: the timing hook of the named sections run
    in this process (train/timing.py; a measurement's, benchmarks/); untimed by default.
    """
    earlier = job.run.dir
    if not (resume_run or overwrite):
        job = beside_earlier(job)  # a rerun of a job whose run directory memtrain named: runs/job-2, ...
    stop = StopRequest()
    with on_stop_signals(stop.record):
        start_resource_tracker()
        refuse_live_run(job.run.dir)
        dataset = open_dataset(job.data.path, verify=verify or job.data.verify)
        check_trainable(dataset)
        context = server_context(dataset, job, resuming=resume_run, replaying=replay is not None, cores=CORES)
        try:  # torch: outlined when workers compute; a kept outline's child is let go if the run never adopts it
            return _train(job, dataset, context, stop, resume_run=resume_run, overwrite=overwrite, asked=asked,
                          quiet=quiet, replay=replay, callbacks=callbacks, say=say or _say, timer=timer,
                          earlier=earlier if earlier != job.run.dir else None)
        finally:
            release = getattr(context.model, "release", None)
            if release is not None:
                release()


def _train(job: Job, dataset: Dataset, context: ModelContext, stop: StopRequest, *, resume_run: bool,
           overwrite: bool, asked: Collection[str], quiet: bool, replay: Lineage | None,
           callbacks: Sequence[Any], say: Callable[[str], None], earlier: Path | None = None,
           timer: Timer = UNTIMED) -> TrainSummary:
    """``train`` once the server has its model context: the run's engine chosen (or the job refused), the start-up
    checks, the run directory, the run."""
    train_rows = dataset.split("train").rows
    choice = choose(job, context, train_rows, lineage=replay)  # train/server/choice.py: the one table
    runtime = startup_check(context, dataset, job.train.blas_threads)  # a model's dry run: its errors exit 2 here
    check_monitor(job.train.monitor, context.classifier, dataset.split("val").rows > 0, job.train.patience)
    room = room_needed(job, context, per_epoch=job_plan(job, train_rows).per_epoch,
                       slots=round_slots(job))  # every file the run will write, at its peak
    allow_open_files(job)  # a mapped buffer per task: the limit of open files, raised or refused before writing
    check_cluster(job, stopped=lambda: stop.signum)  # a wrong address leaves no run directory behind
    run = open_run_dir(job, resume=resume_run, overwrite=overwrite, layout=context.layout.to_json(),
                       asked=asked, one_pass=choice.one_pass, need_exchange=room.exchange, need_run=room.run)
    # after the run directory's refusals (a note above an error reads as its cause), and only when not quiet
    notes = [choice.advice(train_rows)]
    if earlier is not None:
        notes.append(f"{earlier} holds an earlier run: this one is {job.run.dir} (to continue that one: "
                     f"`memtrain train --resume {earlier}`; to replace it: --overwrite)")
    try:
        for note in filter(None, notes):
            run.event(f"note: {note}")
            if not quiet:
                say(note)
        if runtime:
            run.event(runtime)
        return Trainer(job, dataset, context, run, stop, choice, quiet=quiet, callbacks=callbacks,
                       timer=timer).run(run.decision)
    except (MemtrainError, OSError) as exc:
        if not isinstance(exc, Interrupted):  # the run's log tells how it ended, even with no terminal
            run.event(f"failed: {exc}")
        raise
    finally:
        run.close()


def _say(note: str) -> None:
    print(f"memtrain train: note: {note}", file=sys.stderr, flush=True)


def job_plan(job: Job, train_rows: int) -> Plan:
    """The job's plan (train/plan.py) for a train split of ``train_rows`` rows."""
    t = job.train
    return Plan(train_rows, t.batch_size, t.tasks_per_update, t.seed, t.epochs, shuffle=t.shuffle,
                window=t.shuffle_window)


def round_slots(job: Job) -> int:
    """The most participants a stretch may have: the workers asked for, or as many as cores (and tasks)."""
    workers = job.train.workers
    return min(CORES, job.train.tasks_per_update) if workers == "auto" else max(1, workers)


class Trainer:
    """The epoch loop of one run, with ``choice``'s engine (train/server/choice.py), made once at start."""

    def __init__(self, job: Job, dataset: Dataset, context: ModelContext, run: RunDir, stop: StopRequest,
                 choice: Choice, *, quiet: bool = False, callbacks: Sequence[Any] = (), timer: Timer = UNTIMED):
        self.job, self.dataset, self.context, self.run_dir, self.stop = job, dataset, context, run, stop
        self.choice, self.timer = choice, timer
        timed_sections(self, timer, ("stretch_chores", "evaluate", "end_epoch"))  # train/timing.py: untimed, nothing
        self.callbacks = callbacks
        self.quiet = quiet
        self.train_rows = dataset.split("train").rows
        self.val_rows = dataset.split("val").rows
        self.plan = job_plan(job, self.train_rows)
        self.describe_rows = RowWords(dataset, self.plan)
        self.per_epoch = choice.per_epoch  # async mode: groups of gradients; an additive model: its one solve
        self.checkpointed: int | None = None
        self.staged_best = StagedBest(run.path)  # the best epoch's checkpoint, off the schedule, until the run stops
        self.started = time.monotonic()
        self.slots = round_slots(job)
        self.board = create_round_files(run.exchange, context.layout.size, job.train.tasks_per_update, self.slots,
                                        self.plan.per_epoch, choice.banks)
        self.memory_board = Board(1)
        self.logbook = Logbook(run=run, exchange=run.exchange, plan=self.plan,
                               records=open_records(RECORDS.path(run.exchange), self.plan.per_epoch,
                                                    job.train.tasks_per_update),
                               optimizer=job.train.optimizer, on_nonfinite=job.train.on_nonfinite,
                               size=context.layout.size, describe_rows=self.describe_rows, log=self.log,
                               staleness=job.train.staleness)
        self.chores = Chores(self.logbook)

    def run(self, decision: Decision | None) -> TrainSummary:
        """``decision``: what a resume was allowed to change; None for a new run."""
        self.stop.deferred = True  # from here a stop checkpoints where the run stands
        if self.stop.signum is not None:
            raise Interrupted(f"stopped by {signal.Signals(self.stop.signum).name} during start-up")
        position = (resume(self.run_dir, self.job, self.context, self.train_rows, decision) if decision is not None
                    else start_fresh(self.run_dir, self.job, self.context))
        self.checkpointed = position.update_index(self.per_epoch) if decision is not None else None
        self.monitor = monitor_for(self.job, self.run_dir.path, position.epoch, self.callbacks)
        newer = unpublish_after(self.run_dir.path, position.version)
        if newer:
            self.log(f"unpublished versions {newer[0]}-{newer[-1]}: made after the checkpoint, they are made again")
        self.log(f"server pid {os.getpid()}")
        self.in_server = InServer(WorkerState(self._setup(), alive=lambda: None, board=self.memory_board,
                                              chores=lambda: self.stretch_chores(position), keep_statistics=True,
                                              plan=self.plan, dataset=self.dataset, context=self.context,
                                              timer=self.timer))
        self.scheduler = Scheduler(task_timeout=self.job.train.task_timeout, max_attempts=self.job.train.max_attempts,
                                   describe_task=self.describe_task, log=self.log,
                                   stop_requested=lambda: self.stop.requested,
                                   discard=self.discard_attempt, describe_memory=self.describe_memory,
                                   backup=backup_rule(self.job), check_mapped=self.check_mapped)
        engine = self.choose(position)  # the one place the mode is chosen; the placement with it
        try:
            with threadpool_limits(limits=self.job.train.blas_threads):  # the rounds it runs itself: same arithmetic
                last = self.fit(position, engine) or self._last_epoch_record()
        except (KeyboardInterrupt, Interrupted) as exc:
            self.placement.close(timeout=2.0)
            raise self._interrupted(position, exc) from None
        finally:
            self.logbook.write()
            engine.close()
            self.placement.close()
            self.board.close()
            self.monitor.close()
            self.staged_best.drop()  # committed by now if the run stopped as it should; a failed run's is lost
            discard_building(self.run_dir.path, os.getpid())
        self.log(f"done: {ONE_PASS if self.choice.one_pass else plural(position.epoch, 'epoch')}, "
                 f"weight version {position.version}")
        return TrainSummary(self.run_dir.path, position.version, position.epoch, last, position.best,
                            time.monotonic() - self.started, self.scheduler.deaths,
                            stopped_early=position.epoch < self.job.train.epochs
                            and self.monitor.exhausted(position.epoch, position.best), monitor=self.job.train.monitor,
                            one_pass=self.choice.one_pass)

    def choose(self, position: Position) -> EpochEngine:
        """The run's placement and engine, as the ``Choice`` made at start says (train/server/choice.py), the
        reasons logged (docs/async.md, "Where it runs"). The engine is handed what it uses of the server
        (``EngineContext``), made once here."""
        for note in self.choice.notes:
            self.log(note)
        self.placement = {"cluster": self._cluster_placement, "rounds": self._rounds_placement,
                          "stream": self._stream_placement, "desk": self._stream_placement}[self.choice.placement](
                              position)
        self.engine_context = EngineContext(
            train=self.job.train, keep_versions=self.job.run.keep_versions, plan=self.plan, per_epoch=self.per_epoch,
            size=self.context.layout.size, run_path=self.run_dir.path, exchange=self.run_dir.exchange,
            placement=self.placement, scheduler=self.scheduler, logbook=self.logbook, chores=self.chores,
            board=self.board, memory_board=self.memory_board, stop=self.stop, log=self.log,
            describe_rows=self.describe_rows, timer=self.timer)
        self.engine = self.choice.make(self.engine_context, self.in_server.state.rounds, self.run_dir)
        return self.engine

    def _cluster_placement(self, position: Position) -> OnCluster:
        """A cluster's Dask workers (synchronous only: ``train`` refuses the other modes there)."""
        opened = timed(self.timer, "cluster", open_cluster)  # train/timing.py: untimed, open_cluster itself
        return OnCluster(opened(self.job, self._setup(), self.run_dir, self.log, stopped=lambda: self.stop.signum,
                                timer=self.timer), self.log)

    def _rounds_placement(self, position: Position) -> Placement:
        """The rounds' placement: worker processes or the server's threads, measured at start (placement.py)."""
        train = self.job.train
        count, why = thread_candidates(setting=train.server_threads, tasks=train.tasks_per_update, cores=CORES,
                                       blas_threads=train.blas_threads, model=self.context.model)
        threads = ServerThreads(count=count, timed=train.server_threads == "auto", why=why, log=self.log)
        return Placement(workers=train.workers, tasks=train.tasks_per_update, cores=CORES,
                         in_server=self.in_server, start_pool=self._start_pool, log=self.log,
                         threads=threads, start_cost=worker_start_cost(self.context.build_seconds),
                         outlined=getattr(self.context.model, "kept", None) is not None)

    def _stream_placement(self, position: Position) -> Streamed:
        """Gradients streamed to ``train.workers`` processes (at the desk, they step too), or (0, or "auto" when
        workers cannot pay for themselves) the server computes them itself."""
        train, choice = self.job.train, self.choice
        count, why = stream_workers(workers=train.workers, count=round_slots(self.job),
                                    task_seconds=lambda: self.time_task(position), tasks=choice.tasks,
                                    remaining=self.per_epoch * train.epochs - position.update_index(self.per_epoch),
                                    start_cost=worker_start_cost(self.context.build_seconds))
        if count == 0:
            return Streamed(self.in_server, f"{choice.words}: gradients in the server ({why})", self.log)
        if choice.placement == "desk":
            return Streamed(self._start_pool(count), f"{choice.words}: gradients and steps on {count} worker "
                                                     f"processes, at the desk ({why})", self.log)
        return Streamed(self._start_pool(count), f"{choice.words}: gradients on {count} worker processes, the "
                                                 f"steps in the server ({why})", self.log)

    def time_task(self, position: Position) -> float:
        """Seconds of one gradient task of the epoch's first update, computed here (the least of three)."""
        state = self.in_server.state
        rows = self.plan.updates(position.epoch)[0].tasks[0]
        x, y = state.task_rows(position.epoch, rows.lo, rows.hi)
        layout, model = self.context.layout, self.context.model
        weights = open_npy(weights_path(self.run_dir.path, position.version), shape=(layout.size,), dtype=np.float32)
        out = np.empty(layout.size, dtype=np.float32)
        seeded = state.gradient.seeds(position.version, 0)  # timed without the fault points and test hooks
        times = []
        for _ in range(3):
            started = time.perf_counter()
            model.loss_and_grad(layout.views(weights), x, y, layout.views(out), **seeded)
            times.append(time.perf_counter() - started)
        return min(times)

    def check_mapped(self) -> None:
        """After a worker's SIGBUS: the headers and sizes of the dataset's shards, the files a worker maps that
        someone else may change (raises CorruptFileError naming one that shrank)."""
        for split in ("train", "val"):
            self.dataset.split(split).check_files()

    def _start_pool(self, count: int) -> WorkerPool:
        """``count`` workers, the first the outline's kept child if there is one (train/server/outline.py)."""
        adopt = getattr(self.context.model, "adopt", lambda: None)()
        pool = WorkerPool(self._setup(), count, adopt=adopt, max_starts=self.job.train.max_attempts)
        kept = f" (pid {adopt.process.pid}: the process that outlined the model)" if adopt is not None else ""
        self.log(f"workers started: pids {' '.join(map(str, pool.pids()))}{kept}")
        return pool

    def fit(self, position: Position, engine: EpochEngine) -> dict[str, Any]:
        """The epoch loop: each epoch run by ``engine`` until it says the epoch is done, evaluated, checkpointed.
        A run in one piece (``Choice.whole``) is one such epoch, shown by its end alone."""
        last: dict[str, Any] = {}
        whole = self.choice.whole
        epochs = 1 if whole else self.job.train.epochs
        for epoch in range(position.epoch, epochs):
            if self.monitor.exhausted(position.epoch, position.best):  # a resumed run that had stopped early
                break
            started = time.monotonic()
            with reporting(f"epoch {epoch + 1}/{epochs}", self.per_epoch, plain_every=math.inf,
                           quiet=self.quiet or whole) as bar:
                self.chores.epoch(bar, started)
                while not engine.epoch_done(position):  # an engine's run cut short (a fault, a probe) goes on
                    engine.run(position)
                last = self.end_epoch(position, started, final=epoch + 1 == epochs)
                engine.epoch_ended(position)
                if not whole:
                    line = self.epoch_line(last)
                    self.log(line)  # the run's own record: the console may be gone (a closed terminal or pipe)
                    bar.line(line)
        return last

    def stretch_chores(self, position: Position) -> bool:
        """Called by the rounds the server runs itself, between two updates; True ends the stretch there."""
        return self.chores.in_stretch(position, self.memory_board.ledger, self.engine_context.stretch_ends)

    def end_epoch(self, position: Position, started: float, *, final: bool) -> dict[str, Any]:
        self.logbook.write()

        def retire() -> None:  # so that the run holds keep_versions versions whenever it stops after this
            oldest = min(position.schedule.read_versions(), default=position.version)  # still read
            retire_weights(self.run_dir.path, versions_to_keep(self.job.run.keep_versions, position.version, oldest),
                           position.version)

        record = make(METRICS_EPOCH, kind="epoch", epoch=position.epoch + 1,
                      update=(position.epoch + 1) * self.per_epoch, version=position.version,
                      loss=position.epoch_loss / max(position.epoch_rows, 1),
                      **self.evaluate(position.version, chores=retire),
                      samples_per_s=position.epoch_rows / max(time.monotonic() - started, 1e-9), time=time.time())
        if self.choice.one_pass:
            record["loss"] = None  # one closed-form solve: there is no running training loss
        self.run_dir.metric(record)
        verdict = self.monitor.epoch_ended(position, record)  # train/server/monitor.py: best epoch, early stop, logs
        position.epoch, position.batch, position.epoch_loss, position.epoch_rows = position.epoch + 1, 0, 0.0, 0
        if verdict.stop is not None or verdict.failure is not None:
            self.log(verdict.stop or str(verdict.failure))
            final = True
        scheduled = final or position.epoch % self.job.run.checkpoint_every == 0
        if verdict.improved and self.job.run.keep_best and not scheduled:
            stage_best(self.run_dir, self.job, self.context, position, self.per_epoch, record, self.staged_best)
        elif verdict.improved:
            self.staged_best.forget()  # an earlier best's copy: this epoch's checkpoint below is the best's
        if scheduled:
            save_checkpoint(self.run_dir, self.job, self.context, position, self.per_epoch, record)
            self.checkpointed = position.update_index(self.per_epoch)
        if final:
            commit_best(self.run_dir, self.job, position, self.staged_best)
        if verdict.failure is not None:
            raise verdict.failure
        return record

    def evaluate(self, version: int, chores: Callable[[], None] | None = None) -> dict[str, float]:
        tasks = eval_tasks(self.val_rows, self.job.train.eval_rows, at_least=self.job.train.tasks_per_update)
        if not tasks:
            if chores is not None:
                chores()
            return {}
        results = self.scheduler.run(self.placement.transport,
                                     [EvalTask(task=t.task, attempt=0, version=version, lo=t.lo, hi=t.hi)
                                      for t in tasks], chores)
        rows = sum(r.rows for r in results)
        metrics = {"val_loss": sum(r.loss for r in results) / rows}
        if self.context.classifier:
            metrics["val_accuracy"] = sum(r.correct for r in results) / rows
        return metrics | validation_metrics(self.run_dir.exchange, version, results, self.context,
                                            kept=self.in_server.state.kept_statistics)

    def epoch_line(self, record: dict[str, Any]) -> str:
        parts = [f"epoch {record['epoch']}/{self.job.train.epochs}"]
        if record["loss"] is not None:
            parts.append(f"loss {record['loss']:.4f}")
        parts += [f"{key} {record[key]:.4f}" for key in SHOWN if key in record]
        parts.append(f"{record['samples_per_s']:,.0f} samples/s")
        return "  ".join(parts)

    def _interrupted(self, position: Position, exc: BaseException) -> Interrupted:
        self.logbook.write()
        index = position.update_index(self.per_epoch)
        if self.checkpointed != index and position.version > 0:
            save_checkpoint(self.run_dir, self.job, self.context, position, self.per_epoch)
        commit_best(self.run_dir, self.job, position, self.staged_best)
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

    def discard_attempt(self, message: Task) -> None:
        """Delete the file a dead or superseded attempt may have written: an evaluation's sums (the Trainer's own
        tasks), or what the engine that handed the task out knows of (a streamed gradient, a partial)."""
        if isinstance(message, EvalTask):
            discard([METRICS.path(self.run_dir.exchange, message.version, message.task, message.attempt)])
        self.engine.discard(message)

    def describe_task(self, message: Task) -> str:
        if isinstance(message, EvalTask):
            return f"evaluation task {message.task} ({self.describe_rows(message.lo, message.hi, 'val')})"
        if isinstance(message, StepTask):
            return (f"step slice {message.task} (parameters {message.lo}-{message.hi}) of update "
                    f"{update_number(message.update)}")
        if isinstance(message, GradTask):  # who handed it out says what its numbers mean
            return self.engine.describe_gradient(message)
        return f"statistics task {message.task} ({self.describe_rows(message.lo, message.hi)})"

    def describe_memory(self, message: Task) -> str:
        """What a task holds in memory at once: its rows (a statistics task's chunk), read and normalized; a step
        slice (a cluster run's), its new weights and optimizer state."""
        if isinstance(message, StepTask):
            held = (message.hi - message.lo) * 4 * (1 + len(state_names(self.job.train.optimizer)))
            return (f"the step slice held {size_text(held)} of new weights and optimizer state; the version, "
                    "its state and the update's gradients are mapped files")
        split = self.dataset.split("val" if isinstance(message, EvalTask) else "train")
        rows = message.hi - message.lo
        at_once = min(rows, message.chunk_rows) if isinstance(message, StatsTask) else rows
        features = int(np.prod(split.x_shape, dtype=np.int64))
        held = at_once * features * (split.x_dtype.itemsize + 4)  # the rows as stored, and normalized (float32)
        text = (f"the task held {at_once:,} rows at once ({features:,} features: {size_text(held)} read and "
                f"normalized, plus the model's temporaries")
        if isinstance(message, StatsTask):
            partial = self.context.stats_layout.size * 8
            return text + f"; its partial statistics, {size_text(partial)}, are a mapped file)"
        weights = self.context.layout.size * 4
        return text + f"; the weights, {size_text(weights)}, are a mapped file)"

    def log(self, text: str) -> None:
        self.run_dir.event(text)

    def _setup(self) -> WorkerSetup:
        job = self.job
        rounds = RoundSetup(batch_size=job.train.batch_size, tasks_per_update=job.train.tasks_per_update,
                            seed=job.train.seed, epochs=job.train.epochs, shuffle=job.train.shuffle,
                            shuffle_window=job.train.shuffle_window, keep_versions=job.run.keep_versions,
                            on_nonfinite=job.train.on_nonfinite, slots=self.slots, staleness=job.train.staleness)
        return WorkerSetup(server_pid=os.getpid(), run_dir=str(self.run_dir.path),
                           exchange_dir=str(self.run_dir.exchange), dataset=str(self.dataset.path),
                           normalize=job.data.normalize, model_kind=job.model.kind,
                           model_options=tuple(job.model.options.items()), blas_threads=job.train.blas_threads,
                           optimizer=job.train.optimizer, rounds=rounds, target_scale=self.context.target)


def backup_rule(job: Job) -> BackupRule | None:
    """The straggler rule of a cluster run's tasks (docs/cluster.md, "Stragglers"); None on one machine, where
    the rounds run the gradients, and when ``train.backup_ratio`` is 0."""
    if not job.run.cluster or not job.train.backup_ratio:
        return None
    return BackupRule(ratio=job.train.backup_ratio, seconds=job.train.backup_seconds)


def create_round_files(exchange: Path, size: int, tasks: int, slots: int, per_epoch: int, banks: int) -> Board:
    """The exchange files the rounds use, made once per run: a gradient buffer per task (and bank:
    plan.gradient_banks), the block digests, the records and the board (the optimizer state is made by
    train/records/state.py)."""
    for task in range(tasks):
        for bank in range(banks):
            allocate_npy(GRADIENT_BUFFER.path(exchange, task, bank), (size,), np.float32)
    create_digests(exchange, size)
    create_records(RECORDS.path(exchange), per_epoch, tasks)
    return Board.create(BOARD.path(exchange), slots)
