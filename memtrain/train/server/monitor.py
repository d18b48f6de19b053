"""Epoch records -> the best epoch (``train.monitor``), early stopping (``train.patience``), the metric logs
(``run.log_to``: ``metrics.csv``, TensorBoard event files) and the callbacks of ``memtrain.fit``.

The server makes one call at the end of each epoch, ``Monitor.epoch_ended``, after the epoch record is in
``metrics.jsonl`` and before the checkpoint is written; the ``Verdict`` it returns says whether the epoch is
the best so far (its checkpoint is kept, ``run.keep_best``), whether training stops early, and which
callback failed. The best epoch record lives in the run's position, so it is checkpointed and a resumed run
goes on with the same best epoch and the same count of epochs without improvement. The logs are views of
``metrics.jsonl``: a start or a resume rewrites ``metrics.csv`` from it, and TensorBoard is told to drop what
an earlier session wrote after the resumed epoch (``purge_step``), so neither keeps an epoch the run forgot.

Glossary: the **monitor** is the epoch metric compared; its **mode** says whether lower (``min``) or higher
(``max``) is better; **patience** is how many epochs without a better value end training.
"""

from __future__ import annotations

import csv
import io
import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrain.config import HIGHER_IS_BETTER, MONITORED
from memtrain.errors import InputError, Interrupted, MemtrainError, plural
from memtrain.files import append_text, publish, read_jsonl
from memtrain.layout import RUN_CSV, RUN_METRICS, RUN_TENSORBOARD, run_folder, tensorboard_suffix

# What TensorBoard gets per epoch: the record's metrics (its counters and clock are the step and wall time; a
# reinforcement-learning version's line also names the versions and the slot its shards came from).
NOT_LOGGED = ("kind", "epoch", "update", "version", "time", "eval_version", "learned_from", "collected_at", "slot")


def direction(monitor: str, mode: str) -> str:
    """``"min"`` or ``"max"``: ``mode`` itself, or for ``"auto"`` what suits the metric."""
    if mode != "auto":
        return mode
    return "max" if monitor in HIGHER_IS_BETTER else "min"


def check_monitor(monitor: str, classifier: bool, has_validation: bool, patience: int | None) -> None:
    """The monitor is a metric this model reports (classification or regression); early stopping on a
    validation metric needs a validation split (without one and without patience, no epoch is "best")."""
    regression_only = ("val_r2", "val_rmse", "val_mae")
    classification_only = ("val_accuracy", "val_macro_f1", "val_log_loss")
    if monitor in (classification_only if not classifier else regression_only):
        reported = ", ".join(m for m in MONITORED if m not in (classification_only if not classifier
                                                                  else regression_only))
        raise InputError(f"train.monitor = {monitor!r} is not reported for "
                         f"{'classification' if classifier else 'regression'}", expected=f"one of {reported}",
                         found=repr(monitor))
    if monitor.startswith("val_") and not has_validation and patience is not None:
        raise InputError(f"train.monitor = {monitor!r} needs a validation split, and the dataset has none",
                         hint="prepare the data with a validation fraction, or set train.monitor = \"loss\"")


@dataclass(frozen=True)
class Verdict:
    """What the end of an epoch decided: ``improved`` (the best epoch so far), ``stop`` (why training stops
    early, or None) and ``failure`` (a callback raised: to be raised once the checkpoint is written)."""

    improved: bool
    stop: str | None = None
    failure: MemtrainError | None = None


class Monitor:
    """The best epoch, early stopping, the metric logs and the callbacks of one training session.

    ``callbacks``: objects with an ``on_epoch_end(metrics)`` method, or plain functions called so;
    ``metrics`` is a copy of the epoch record. ``first_epoch``: the epochs already done (a resume).
    """

    def __init__(self, *, monitor: str, mode: str, patience: int | None, log_to: Sequence[str], run_dir: Path,
                 first_epoch: int, callbacks: Sequence[Any] = ()):
        self.monitor, self.mode, self.patience = monitor, direction(monitor, mode), patience
        self.run_dir = run_dir
        self.callbacks = [(_callback_name(c), c if callable(c) and not hasattr(c, "on_epoch_end")
                           else c.on_epoch_end) for c in callbacks]
        self.logs = metric_logs(log_to, run_dir, first_epoch)

    def better(self, value: Any, best: dict[str, Any] | None) -> bool:
        """Whether ``value`` of the monitor beats the best epoch record so far (None: there is none)."""
        return improves(value, None if best is None else best.get(self.monitor), self.mode)

    def epoch_ended(self, position: Any, record: dict[str, Any]) -> Verdict:
        """The end of epoch ``record["epoch"]``: update ``position.best``, write the logs, call the callbacks."""
        improved = self.better(record.get(self.monitor), position.best)
        if improved:
            position.best = record
        for log in self.logs:
            log.write(record)
        failure = self.call_back(record)
        stop = None
        if self.exhausted(record["epoch"], position.best):
            stop = (f"stopping early: no better {self.monitor} for {plural(self.patience, 'epoch')} "
                    f"(best: epoch {position.best['epoch']}, {self.monitor} {position.best[self.monitor]:.4g})")
        return Verdict(improved, stop, failure)

    def exhausted(self, epochs: int, best: dict[str, Any] | None) -> bool:
        """Whether ``train.patience`` epochs have passed, after ``epochs`` epochs, since the best one."""
        return (self.patience is not None and best is not None and self.monitor in best
                and epochs - best["epoch"] >= self.patience)

    def call_back(self, record: dict[str, Any]) -> MemtrainError | None:
        """Call every callback with a copy of the record; the first that raises stops the run (its error)."""
        for name, function in self.callbacks:
            try:
                function(dict(record))
            except KeyboardInterrupt:  # a notebook's stop button during the callback: a stop like Ctrl-C
                error = Interrupted(f"stopped by SIGINT in the on_epoch_end callback {name}")
                return error
            except Exception as exc:
                error = MemtrainError(f"the on_epoch_end callback {name} raised {type(exc).__name__}: {exc} "
                                      f"(after epoch {record['epoch']})",
                                      hint="training stopped with a checkpoint of that epoch; fix the callback "
                                           f"and continue with memtrain.fit(resume={str(self.run_dir)!r})")
                error.__cause__ = exc
                return error
        return None

    def close(self) -> None:
        for log in self.logs:
            log.close()


def improves(value: Any, old: Any, mode: str) -> bool:
    """The keep rule of a best checkpoint: a finite ``value`` strictly better than ``old`` (lower for "min",
    higher for "max"; an earlier record wins a tie), or any finite value when there is no finite ``old``. The
    best epoch's (``train.monitor``) and a reinforcement-learning run's best evaluation return."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return False
    if not isinstance(old, int | float) or not math.isfinite(old):
        return True
    return value < old if mode == "min" else value > old


def _callback_name(callback: Any) -> str:
    return getattr(callback, "__qualname__", None) or type(callback).__qualname__


def metric_logs(log_to: Sequence[str], run_dir: Path, first: int, *, kind: str = "epoch",
                columns: Sequence[str] | None = None) -> list[Any]:
    """The logs ``run.log_to`` asks for, of the ``kind`` records of ``metrics.jsonl`` ("epoch"; a
    reinforcement-learning run's "version" lines, memtrain/rl/server.py); ``first``: the epochs (versions) the
    run has done already; ``columns``: the CSV's (default: the first record's keys)."""
    logs: list[Any] = []
    if "csv" in log_to:
        logs.append(CsvLog(run_dir / RUN_CSV, run_dir / RUN_METRICS, kind=kind, columns=columns))
    if "tensorboard" in log_to:
        logs.append(TensorBoardLog(run_folder(run_dir, RUN_TENSORBOARD), first))
    return logs


def log_step(record: dict[str, Any]) -> int:
    """A record's step in the logs: an epoch record's epoch (the epochs done), a version line's weight version
    made from it (``version`` + 1: the versions done), so that a resume from N drops the steps after N alike."""
    return int(record["epoch"]) if record.get("kind") == "epoch" else int(record["version"]) + 1


class CsvLog:
    """``metrics.csv``: one row per ``kind`` record, the columns ``columns`` or those of the first record (csv
    module); a value that is a list (a version's ``episode_returns``) stays in ``metrics.jsonl`` only.

    Rewritten at start from ``metrics.jsonl`` (which a resume has cut back to its checkpoint), then appended."""

    def __init__(self, path: Path, metrics: Path, *, kind: str = "epoch", columns: Sequence[str] | None = None):
        self.path = path
        records = [r for r in read_jsonl(metrics) if r.get("kind") == kind]
        self.columns: list[str] | None = list(columns) if columns else list(records[0]) if records else None
        text = self._rows(records, header=True) if self.columns else ""
        publish(path, lambda handle: handle.write(text.encode()), durable=False)

    def _rows(self, records: list[dict[str, Any]], *, header: bool) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=self.columns, extrasaction="ignore", lineterminator="\n")
        if header:
            writer.writeheader()
        writer.writerows({k: ("" if v is None else v) for k, v in r.items() if not isinstance(v, list)}
                         for r in records)
        return out.getvalue()

    def write(self, record: dict[str, Any]) -> None:
        header = self.columns is None
        if header:
            self.columns = list(record)
        append_text(self.path, self._rows([record], header=header))

    def close(self) -> None:
        pass


class TensorBoardLog:
    """Event files in ``tensorboard/`` (tensorboardX): each metric of a record as a scalar, at its ``log_step``
    (an epoch record's epoch, a version line's version + 1). After a resume, ``purge_step`` tells TensorBoard to
    drop what an earlier session wrote from that step on."""

    def __init__(self, folder: Path, first_epoch: int):
        """``folder``: the run's ``tensorboard/``, a real directory or absent (run_dir.check_entries: a link
        there is refused before the run starts, so tensorboardX, which follows it, never writes outside)."""
        from tensorboardX import SummaryWriter

        # tensorboardX names a file by the second it opens it: a session resumed within the same second would
        # truncate the last one's file. The suffix keeps them apart, ordered by the epoch each starts from.
        self.writer = SummaryWriter(logdir=str(folder), purge_step=first_epoch + 1 if first_epoch else None,
                                    filename_suffix=tensorboard_suffix(first_epoch, uuid.uuid4().hex[:8]))

    def write(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if key not in NOT_LOGGED and isinstance(value, int | float) and not isinstance(value, bool):
                self.writer.add_scalar(key, value, global_step=log_step(record), walltime=record.get("time"))
        self.writer.flush()  # each epoch is on disk for a TensorBoard that is watching

    def close(self) -> None:
        self.writer.close()


def monitor_for(job: Any, run_dir: Path, first_epoch: int, callbacks: Sequence[Callable[..., Any]] = ()) -> Monitor:
    """The monitor of a job's training session (``first_epoch``: the epochs its run has done already)."""
    return Monitor(monitor=job.train.monitor, mode=job.train.monitor_mode, patience=job.train.patience,
                   log_to=job.run.log_to, run_dir=run_dir, first_epoch=first_epoch, callbacks=callbacks)
