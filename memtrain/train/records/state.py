"""Where a run stands (epoch, batch, weight version) <-> checkpoints; fresh starts and resumes.

All randomness derives from ``train.seed`` (initial weights) and ``(seed, epoch)`` (batch order), so the
position below is the whole RNG state: a resumed run repeats exactly what an uninterrupted one does.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.config import Job
from memtrain.errors import CorruptFileError, InputError, MemtrainError
from memtrain.files import (
    BLOCK_CHECKSUM_ALGO,
    checksum_file,
    open_npy,
    open_regular,
    publish,
    publish_array,
    read_jsonl,
    read_sealed_jsonl,
    seal,
)
from memtrain.layout import (
    CHECKPOINT_WEIGHTS,
    RUN_LINEAGE,
    RUN_METRICS,
    checkpoint_path,
    checkpoint_updates,
    checkpoint_version_name,
    optimizer_state_name,
    weights_path,
)
from memtrain.records import CHECKPOINT_DATA, CHECKPOINT_POSITION, make
from memtrain.train.context import ModelContext
from memtrain.train.exchange.area import OPTIMIZER_STATE
from memtrain.train.exchange.weights import publish_params
from memtrain.train.optim import state_names
from memtrain.train.plan import run_updates_per_epoch
from memtrain.train.records.checkpoint import (
    POSITION_KEYS,
    StagedBest,
    checkpoint_sources,
    discard_incomplete,
    verify_checkpoint,
    write_checkpoint,
)
from memtrain.train.records.counters import position_text
from memtrain.train.records.lineage import continuous, init_record
from memtrain.train.records.record import Decision, add_history, history_entry
from memtrain.train.records.run_dir import RunDir, read_params, write_params
from memtrain.train.schedule import PlannedState, ScheduleState, schedule_state


@dataclass
class Position:
    """The run's place: next (epoch, batch) to compute, and the newest published weight version."""

    epoch: int = 0
    batch: int = 0
    version: int = 0
    epoch_loss: float = 0.0  # summed train loss of the current epoch so far
    epoch_rows: int = 0
    skipped: int = 0
    best: dict[str, Any] | None = None  # best epoch record so far (by validation loss)
    # what the run's schedule keeps across updates (schedule.py: its own object, whose kind the position never
    # asks); a checkpoint stores it under the schedule's name. The default: a synchronous plan's, which keeps none.
    schedule: ScheduleState = dataclasses.field(default_factory=PlannedState)

    def update_index(self, per_epoch: int) -> int:
        return self.epoch * per_epoch + self.batch


def data_description(context: ModelContext, job: Job) -> dict[str, Any]:
    """What a checkpoint needs to rebuild the model and its normalization without the dataset."""
    manifest = context.manifest
    return make(CHECKPOINT_DATA, task=manifest["task"], x=manifest["x"], y=manifest["y"],
                classes=manifest.get("classes"), stats=manifest.get("stats"), normalize=job.data.normalize,
                dataset=str(job.data.path),
                encoding=manifest.get("encoding"),  # tables: predict encodes raw rows as prepare did
                target_scale=context.target.to_json() if context.target is not None else None)


def run_state_names(job: Job, context: ModelContext) -> tuple[str, ...]:
    """The names of the optimizer's state vectors the run keeps: none for an additive model, which has no
    optimizer."""
    return () if context.additive else tuple(state_names(job.train.optimizer))


def start_fresh(run: RunDir, job: Job, context: ModelContext) -> Position:
    # straight into the file: a model of gigabytes (an additive model's tables) is never held twice
    checksum = publish_params(run.path, 0, context.layout, context.model.init(np.random.default_rng(job.train.seed)),
                              made_by="the model's init")
    run.lineage(init_record(job.train.seed, checksum))
    zeros = np.zeros(context.layout.size, dtype=np.float32)
    for name in run_state_names(job, context):
        for parity in (0, 1):
            publish_array(OPTIMIZER_STATE.path(run.exchange, name, parity), zeros, durable=False)
    return Position(schedule=schedule_state(job.train))


def resume(run: RunDir, job: Job, context: ModelContext, train_rows: int, decision: Decision) -> Position:
    """Continue from the newest complete, verified checkpoint (or start fresh if there is none).

    ``decision`` is what ``record.decide`` allowed; it becomes the run's next history entry.
    """
    discard_incomplete(run.path)
    found, lineage = _resume_point(run)  # before anything is written: a gap is refused
    if found is not None and found[1]["layout"] != context.layout.to_json():
        raise InputError("the checkpoint's parameter layout does not match the job's model", path=found[0],
                         expected=context.layout.to_json()["params"], found=found[1]["layout"]["params"])
    if read_params(run.path) is None:  # a run replaced by --overwrite that died before writing it
        write_params(run.path, context.layout.to_json())
    add_history(run.path, history_entry(decision, checkpoint=found[0].name if found else None,
                                        epoch=found[1]["position"]["epoch"] if found else 0))
    if decision.changes:
        run.event("resume changes " + ", ".join(f"{key} from {old!r} to {new!r}"
                                                 for key, (old, new) in decision.changes.items()))
    if found is None:
        run.event("resume: no complete checkpoint; starting from the beginning")
        _truncate_logs(run, -1, -1)
        return start_fresh(run, job, context)
    path, meta = found
    stored = meta["position"]
    position = Position(**{key: stored[key] for key in POSITION_KEYS}, schedule=schedule_state(job.train, stored))
    _restore_files(run, job, context, path, position)
    per_epoch = job_updates_per_epoch(job, train_rows)
    _truncate_logs(run, position.update_index(per_epoch), position.version, lineage)
    run.event(f"resumed from {path.name}: {position_text(position.epoch, position.batch, per_epoch)}, "
              f"weight version {position.version}")
    return position


def _warn(run: RunDir, text: str) -> None:
    run.event(text)
    print(f"memtrain train: warning: {text}", flush=True)


def job_updates_per_epoch(job: Job, train_rows: int) -> int:
    """Updates per epoch: the plan's, or in async mode its groups of ``train.async_group`` gradients."""
    group = job.train.async_group if job.train.mode == "async" else None
    return run_updates_per_epoch(train_rows, job.train.batch_size, job.train.tasks_per_update, group)


def _restore_files(run: RunDir, job: Job, context: ModelContext, path: Path, position: Position) -> None:
    size, version = context.layout.size, position.version
    weights = open_npy(path / CHECKPOINT_WEIGHTS, shape=(size,), dtype=np.float32)
    publish_array(weights_path(run.path, version), weights, durable=False)
    for older in {v for v in position.schedule.read_versions() if v != version}:  # the versions still read
        stored = open_npy(path / checkpoint_version_name(older), shape=(size,), dtype=np.float32)
        publish_array(weights_path(run.path, older), stored, durable=False)
    for name in run_state_names(job, context):
        state = open_npy(path / optimizer_state_name(name), shape=(size,), dtype=np.float32)
        publish_array(OPTIMIZER_STATE.path(run.exchange, name, version % 2), state, durable=False)
        publish_array(OPTIMIZER_STATE.path(run.exchange, name, 1 - version % 2), state, durable=False)


def _resume_point(run: RunDir) -> tuple[tuple[Path, dict[str, Any]] | None, list[dict[str, Any]] | None]:
    """The newest checkpoint whose files match their checksums and up to which the lineage is continuous
    (``lineage.continuous``), and the lineage records a resume from it keeps (None: a format-1 lineage,
    unsealed, kept as it is). A damaged checkpoint, or one beyond a gap in the lineage, is skipped with a
    warning for the previous one, so the run stays replayable; if a gap leaves none, the resume is refused
    naming it (never a fresh start that would drop the run's training). (None, None): no checkpoint at all."""
    path = run.path / RUN_LINEAGE
    records, damaged = read_sealed_jsonl(path, what="lineage record")
    legacy = not records and bool(damaged) and not _sealed_format(path)
    for problem in [] if legacy else damaged:
        _warn(run, f"dropping a damaged lineage record: {problem}")
    gap: CorruptFileError | None = None
    for update in reversed(checkpoint_updates(run.path)):
        checkpoint = checkpoint_path(run.path, update)
        try:
            meta = verify_checkpoint(checkpoint)
            if legacy:
                return (checkpoint, meta), None
            weights = checksum_file(checkpoint / CHECKPOINT_WEIGHTS, algo=BLOCK_CHECKSUM_ALGO)
            return (checkpoint, meta), continuous(records, meta["position"]["version"], weights, path)
        except CorruptFileError as exc:
            gap = gap or (exc if exc.path == path else None)
            _warn(run, f"skipping checkpoint {checkpoint.name}: {exc}")
        except MemtrainError as exc:
            _warn(run, f"skipping checkpoint {checkpoint.name}: {exc}")
    if gap is not None:
        raise gap
    return None, None


def _sealed_format(path: Path) -> bool:
    """Whether the lineage's first line has a format field (format 2 on, whose lines are all sealed)."""
    with contextlib.suppress(OSError, ValueError, UnicodeDecodeError), open_regular(path, text=True) as handle:
        first = json.loads(handle.readline())
        return isinstance(first, dict) and "format" in first
    return True


def _truncate_logs(run: RunDir, update: int, version: int, lineage: list[dict[str, Any]] | None = None) -> None:
    """Drop log lines written after the checkpoint we resume from (``update`` updates done): they will be
    written again. Records are numbered as in train/records/counters.py: update n's records say ``"update": n``.
    ``lineage``: the lineage records to keep, checked continuous (``_resume_point``); if None, every intact
    one up to ``version``. A damaged lineage line is dropped too (with a warning): its record can no longer
    be trusted."""
    keep_metrics = [r for r in read_jsonl(run.path / RUN_METRICS) if r.get("update", -1) <= update]
    if lineage is None:
        lineage, damaged = read_sealed_jsonl(run.path / RUN_LINEAGE, what="lineage record")
        for problem in damaged:
            _warn(run, f"dropping a damaged lineage record: {problem}")
    keep_lineage = [seal(r) for r in lineage if isinstance(r.get("version"), int) and r["version"] <= version]
    for name, records in ((RUN_METRICS, keep_metrics), (RUN_LINEAGE, keep_lineage)):
        text = "".join(json.dumps(r) + "\n" for r in records)
        publish(run.path / name, lambda handle, t=text: handle.write(t.encode()), durable=False)


def save_checkpoint(run: RunDir, job: Job, context: ModelContext, position: Position, per_epoch: int,
                    metrics: dict[str, Any] | None = None) -> Path:
    best = position.best.get("update") if job.run.keep_best and position.best else None
    saved = write_checkpoint(run.path, position.update_index(per_epoch),
                             checkpoint_meta(job, context, position, per_epoch, metrics),
                             weights_path(run.path, position.version), _state_files(run, job, context, position),
                             job.run.keep_checkpoints, best, older=_older_versions(run, position))
    run.event(f"checkpoint {saved.name} written ({position_text(position.epoch, position.batch, per_epoch)}, "
              f"weight version {position.version})")
    return saved


def stage_best(run: RunDir, job: Job, context: ModelContext, position: Position, per_epoch: int,
               metrics: dict[str, Any], staged: StagedBest) -> None:
    """The best epoch so far, off the checkpoint schedule: its checkpoint's files copied, committed when the run
    stops (``StagedBest``)."""
    sources = checkpoint_sources(weights_path(run.path, position.version), _state_files(run, job, context, position),
                                 _older_versions(run, position))
    staged.stage(position.update_index(per_epoch), checkpoint_meta(job, context, position, per_epoch, metrics),
                 sources)


def commit_best(run: RunDir, job: Job, position: Position, staged: StagedBest) -> None:
    """When the run stops: the staged best epoch's checkpoint committed, if it is still the best."""
    best = position.best.get("update") if job.run.keep_best and position.best else None
    saved = staged.commit(best, job.run.keep_checkpoints)
    if saved is not None:
        run.event(f"checkpoint {saved.name} written (the best epoch, {position.best.get('epoch')})")


def checkpoint_meta(job: Job, context: ModelContext, position: Position, per_epoch: int,
                    metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "position": make(CHECKPOINT_POSITION, **position_json(position)),
        "epoch": position.epoch,
        "update": position.update_index(per_epoch),
        "weights_version": position.version,
        "rng": {"seed": job.train.seed, "scheme": "init from seed; batch order from (seed, epoch)"},
        "optimizer": {"name": job.train.optimizer.name, "slots": list(run_state_names(job, context)),
                      "step": position.version},
        "model": {"kind": job.model.kind, "options": job.model.options},
        "data": data_description(context, job),
        "layout": context.layout.to_json(),
        "metrics": metrics or {},  # the epoch record this checkpoint was taken after (empty mid-epoch)
        "best": position.best or {},  # the best epoch record so far, by train.monitor
        # written only because its epoch is the best so far (off the run.checkpoint_every schedule): pruned once
        # a later epoch is better, so that it never takes the place of a scheduled checkpoint
        "best_only": bool(metrics) and metrics == position.best and job.run.keep_best
                     and position.epoch % job.run.checkpoint_every != 0 and position.epoch < job.train.epochs,
    }


def position_json(position: Position) -> dict[str, Any]:
    """A checkpoint's ``position``: the run's place, and its schedule's state under the schedule's name (copies:
    a staged best checkpoint's metadata waits until the run stops)."""
    own = dataclasses.asdict(position)
    del own["schedule"]
    return own | {position.schedule.NAME: copy.deepcopy(position.schedule.to_json())}


def _state_files(run: RunDir, job: Job, context: ModelContext, position: Position) -> dict[str, Path]:
    return {name: OPTIMIZER_STATE.path(run.exchange, name, position.version % 2)
            for name in run_state_names(job, context)}


def _older_versions(run: RunDir, position: Position) -> dict[str, Path]:
    return {checkpoint_version_name(v): weights_path(run.path, v) for v in position.schedule.read_versions()
            if v != position.version}
