"""A job <-> the run's own records: ``job.json`` (the job the run was started with) and ``history.jsonl``
(one entry per start and resume, with the changes asked for), and the check a resume makes before it writes.

``job.json`` is written once, inside the run directory before that directory is renamed into place, and is
never rewritten. The job a run follows is ``job.json`` with the ``changes`` of its history applied in
order. Both are sealed (``files.seal``): a damaged record is reported, never trusted. Neither holds the
run directory's own path, so a run directory can be moved (``run.dir`` is wherever it is now).

On resume, the new job is compared with the recorded one, key by key (``section.key``):
- ``FIXED`` keys (the data, the model, what decides the batches and their rows, and the optimizer state) never
  change;
- ``RUNTIME`` keys say how to execute, not what to compute (the weights are bitwise the same for any
  value): they are taken from each start and never recorded as changes;
- every other key (``train.epochs``, ``train.lr`` and the optimizer's settings, ``train.on_nonfinite``,
  ``train.eval_rows``, ``train.chunk_rows``, ``train.blas_threads``, ``run.checkpoint_every``, ``run.keep_*``)
  changes only when named
  with ``--set`` on the resuming command line, and the change becomes a history entry. (A new
  ``chunk_rows`` makes an additive pass's partials on disk another pass's: they are computed again.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memtrain.config import Job, TrainConfig, job_from_dict, job_to_dict
from memtrain.errors import CorruptFileError, InputError
from memtrain.files import publish, read_sealed_json, read_sealed_jsonl, seal, write_sealed_json
from memtrain.layout import RUN_HISTORY, RUN_JOB
from memtrain.order import WINDOW
from memtrain.records import HISTORY_RESUME, HISTORY_START, make

FORMAT = "memtrain.job"
FORMAT_VERSION = 1
FIXED = ("data.path", "data.normalize", "data.scale_target", "model.", "train.seed", "train.batch_size",
         "train.tasks_per_update", "train.shuffle", "train.shuffle_window", "train.optimizer", "train.monitor",
         "train.monitor_mode")  # the best epoch so far was chosen by the monitor
# Settings added to the job after runs were recorded without them, one generation per change (oldest first):
# what their absence means, which is what those runs did, so such a run resumes (and replays, and is
# inspected) as it started (a missing RUNTIME key is its default: _runtime_defaults). Any other missing
# setting is damage. After job record version 1 (30339bc): train.shuffle: every epoch visited the same
# contiguous batches in a seeded order, which is "batches" (its window then unused); train.monitor: the best
# epoch was the lowest val_loss; run.log_to: no other metric logs; train.chunk_rows: read by an additive pass
# alone, which such a run either finished or computes again (its old statistics files are not reused).
# Then data.scale_target (issue 44): the target was trained as it is.
RECORDED_BEFORE = (
    {"train.shuffle": "batches", "train.shuffle_window": WINDOW, "train.monitor": "val_loss",
     "train.monitor_mode": "auto", "run.log_to": [], "train.chunk_rows": TrainConfig.chunk_rows},
    {"data.scale_target": False},
)
# train.blas_threads is not among them: a BLAS (OpenBLAS here) may split an update's products and sums
# differently with another thread count, so the weights' bits depend on it (1e6 parameters, 120 updates in
# the server: 1 and 2 threads end in different versions, each the same run after run). It is adjustable.
RUNTIME = ("data.verify", "train.workers", "train.server_threads", "train.task_timeout", "train.max_attempts",
           "train.backup_ratio", "train.backup_seconds", "run.exchange", "run.cluster", "run.dir")


@dataclass(frozen=True)
class Difference:
    key: str
    recorded: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key}: the run has {_value(self.recorded)}, the new job says {_value(self.new)}"


@dataclass(frozen=True)
class Decision:
    """What a resume may do: the changes it records (``key -> (from, to)``), after every check passed."""

    changes: dict[str, tuple[Any, Any]]


def job_record(job: Job) -> dict[str, Any]:
    """The job as ``job.json`` holds it (unsealed): every default filled in, without the run's own path."""
    sections = json.loads(json.dumps(job_to_dict(job)))
    sections["run"].pop("dir", None)
    return {"format": FORMAT, "version": FORMAT_VERSION, **sections}


def write_records(folder: Path, job: Job) -> None:
    """The records of a new run: ``job.json``, then ``history.jsonl`` with its start entry."""
    write_sealed_json(folder / RUN_JOB, job_record(job), durable=True)
    write_history(folder, [make(HISTORY_START, event="start", time=_now())])


def read_job_record(run_dir: Path) -> dict[str, Any]:
    """The sections of ``job.json`` (data, model, train, run), verified; InputError if it is missing."""
    path = run_dir / RUN_JOB
    if not path.exists():
        raise InputError("not a memtrain run directory: no job.json", path=run_dir,
                         hint="give the directory that `memtrain train` created (the run.dir of the job), or start "
                              "a new run in a new directory with `memtrain train JOB.toml --run-dir NEW_DIR`")
    record = read_sealed_json(path, what="the run's job record")
    if record.get("format") != FORMAT or record.get("version") != FORMAT_VERSION:
        raise CorruptFileError("not a job record this memtrain can read", path=path, where="format",
                               expected=f"{FORMAT} version {FORMAT_VERSION}",
                               found=f"{record.get('format')} version {record.get('version')}")
    sections = {key: value for key, value in record.items() if key not in ("format", "version")}
    if not all(isinstance(sections.get(name), dict) for name in ("data", "model", "train", "run")):
        raise CorruptFileError("the job record lacks a section", path=path,
                               expected="data, model, train and run", found=", ".join(sections))
    for key, value in {**_runtime_defaults(), **_recorded_before(sections)}.items():
        section, _, name = key.partition(".")
        sections[section].setdefault(name, value)
    missing = sorted(set(_every_key()) - set(flatten(sections)))
    if missing:  # a default would silently stand in for what the run really used
        raise CorruptFileError("the job record lacks a setting", path=path, where=", ".join(missing))
    return sections


def _recorded_before(sections: dict[str, Any]) -> dict[str, Any]:
    """The meanings of the settings a record lacks because it was written before they existed: those of every
    generation of RECORDED_BEFORE after the newest one it holds a setting of. A record that lacks a setting of
    that generation or an older one was written by a memtrain that records it, so the lack is damage (a hand
    edit, resealed), never the old meaning: a "rows" run would resume as "batches"."""
    held = flatten(sections)
    newest = max((number for number, generation in enumerate(RECORDED_BEFORE)
                  if any(key in held for key in generation)), default=-1)
    return {key: value for generation in RECORDED_BEFORE[newest + 1:] for key, value in generation.items()}


def _runtime_defaults() -> dict[str, Any]:
    """A RUNTIME key a record lacks (written before the key existed) is its default: it never changes what a
    run computes, and each start sets it anew."""
    defaults = flatten(job_record(job_from_dict({}, base=Path("/"))))
    return {key: defaults[key] for key in RUNTIME if key in defaults}


def _every_key() -> list[str]:
    """``section.key`` of every setting a job record holds (the model's own options vary, its kind does not)."""
    defaults = job_record(job_from_dict({}, base=Path("/")))
    return [key for key in flatten(defaults) if not key.startswith("model.") or key == "model.kind"]


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    """The run's history entries, oldest first; CorruptFileError naming the first damaged line."""
    entries, damaged = read_sealed_jsonl(run_dir / RUN_HISTORY, what="history entry")
    if damaged:
        raise damaged[0]
    return entries


def write_history(folder: Path, entries: list[dict[str, Any]]) -> None:
    """Replace ``history.jsonl`` as a whole (by rename): no reader ever sees a torn entry."""
    text = "".join(json.dumps(seal(entry)) + "\n" for entry in entries)
    publish(folder / RUN_HISTORY, lambda handle: handle.write(text.encode()), durable=True)


def add_history(run_dir: Path, entry: dict[str, Any]) -> None:
    write_history(run_dir, [*read_history(run_dir), make(HISTORY_RESUME, time=_now(), **entry)])


def recorded_job(run_dir: Path) -> dict[str, Any]:
    """The job the run follows now: ``job.json`` with the history's changes applied, ``run.dir`` = ``run_dir``.

    >>> recorded_job(Path("runs/digits-mlp"))["train"]["epochs"]    # doctest: +SKIP
    """
    sections = read_job_record(run_dir)
    for number, entry in enumerate(read_history(run_dir), start=1):
        changes = entry.get("changes", {})
        if not isinstance(changes, dict) or not all(
                kind_of(key) == "adjustable" and isinstance(change, dict) and "to" in change
                for key, change in changes.items()):
            raise CorruptFileError("a history entry's changes are malformed", path=run_dir / RUN_HISTORY,
                                   where=f"line {number}", expected='{"section.key": {"from": ..., "to": ...}}',
                                   found=json.dumps(changes)[:200])
        for key, change in changes.items():
            section, _, name = key.partition(".")
            sections[section][name] = change["to"]
    sections["run"]["dir"] = "."  # relative to the run directory: wherever it is now
    return sections


def flatten(sections: dict[str, Any]) -> dict[str, Any]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": 0.1}`` (one level: a model option's list is one value)."""
    return {f"{section}.{key}": value for section, values in sections.items() if isinstance(values, dict)
            for key, value in values.items()}


def kind_of(key: str) -> str:
    if any(key == fixed or (fixed.endswith(".") and key.startswith(fixed)) for fixed in FIXED):
        return "fixed"
    return "runtime" if key in RUNTIME else "adjustable"


def compare(recorded: dict[str, Any], job: Job, asked: Collection[str]) -> tuple[list[Difference],
                                                                                list[Difference], list[Difference]]:
    """(changes that were asked for, adjustable differences that were not, fixed differences)."""
    old, new = flatten(recorded), flatten(job_record(job))
    allowed, unasked, fixed = [], [], []
    for key in sorted(set(old) | set(new)):
        if old.get(key) == new.get(key):
            continue
        difference = Difference(key, old.get(key), new.get(key))
        kind = kind_of(key)
        if kind == "fixed":
            fixed.append(difference)
        elif kind == "adjustable":
            (allowed if key in asked else unasked).append(difference)
    return allowed, unasked, fixed


def decide(run_dir: Path, job: Job, asked: Collection[str], *, done_epochs: int | None,
           layout: dict[str, Any] | None, recorded_layout: dict[str, Any] | None, one_pass: bool = False) -> Decision:
    """Check that ``job`` may continue the run in ``run_dir``; raises InputError naming every difference.

    Reads only. ``done_epochs``: the epochs of the newest checkpoint (None: none yet). ``layout``: the
    parameter layout of ``job`` on its dataset; ``recorded_layout``: the run's ``params.json``.
    ``one_pass``: an additive model, solved in one pass, for which ``train.epochs`` means nothing to change.
    """
    recorded = recorded_job(run_dir)
    allowed, unasked, fixed = compare(recorded, job, asked)
    fixed = [d for d in fixed if not (d.key == "data.scale_target" and _moot_target_scale(recorded, job))]
    if one_pass:
        fixed += [d for d in allowed + unasked if d.key == "train.epochs"]
        allowed = [d for d in allowed if d.key != "train.epochs"]
        unasked = [d for d in unasked if d.key != "train.epochs"]
    resume = f"memtrain train --resume {run_dir}"
    moved = layout is not None and recorded_layout is not None and layout != recorded_layout
    if fixed or moved:
        lines = [str(d) for d in fixed]
        if moved:
            lines.append(f"parameter layout: the run has {_shapes(recorded_layout)}, the new job gives "
                         f"{_shapes(layout)}")
        lines += [f"{d} (changeable only when named with --set)" for d in unasked]
        raise InputError("cannot resume: the new job changes what the run computes (" + "; ".join(lines) + ")",
                         path=run_dir, hint=f"continue the run as it was with `{resume}`, or start a new run "
                                            "with `memtrain train JOB.toml --run-dir NEW_DIR`")
    if unasked:
        # the suggested command must work: it never asks for fewer epochs than the run has done
        sets = "".join(f" --set {d.key}={_toml(d.new)}" for d in unasked
                       if not (d.key == "train.epochs" and done_epochs is not None and d.new < done_epochs))
        raise InputError("cannot resume: the job differs from the run's record ("
                         + "; ".join(map(str, unasked)) + ")", path=run_dir,
                         hint=f"a setting changes on resume only when named on the command line, e.g. "
                              f"`{resume}{sets}`; or keep the run's settings with `{resume}`")
    epochs = job.train.epochs
    if done_epochs is not None and epochs < done_epochs:
        raise InputError(f"cannot resume with train.epochs = {epochs}: the run has already trained {done_epochs} "
                         "epochs", path=run_dir,
                         hint=f"train longer with `{resume} --set train.epochs={done_epochs + 1}`, or look at it with "
                              f"`memtrain inspect {run_dir}`")
    return Decision({d.key: (d.recorded, d.new) for d in allowed})


def _moot_target_scale(recorded: dict[str, Any], job: Job) -> bool:
    """Whether ``data.scale_target`` changes nothing the run computes: its model and task are not ones it applies
    to (models/target_scale.py), as for every classifier. A run recorded before the key (false) is then resumed
    by a job file that leaves it at its default (true), as before the key existed."""
    from memtrain.dataset import read_manifest
    from memtrain.errors import MemtrainError
    from memtrain.models.target_scale import scalable

    try:
        task = read_manifest(job.data.path)["task"]
    except (MemtrainError, OSError, KeyError, TypeError):
        return False  # unknown: the difference stands
    return not scalable(str(recorded.get("model", {}).get("kind")), task)


def history_entry(decision: Decision, *, checkpoint: str | None, epoch: int) -> dict[str, Any]:
    changes = {key: {"from": old, "to": new} for key, (old, new) in decision.changes.items()}
    return {"event": "resume", "from_checkpoint": checkpoint, "epoch": epoch, "changes": changes}


def _shapes(layout: dict[str, Any]) -> str:
    params = layout.get("params", []) if isinstance(layout, dict) else []
    return ", ".join(f"{p.get('name')} {tuple(p.get('shape', ()))}" for p in params if isinstance(p, dict)) or "none"


def _value(value: Any) -> str:
    return "nothing" if value is None else json.dumps(value)


def _toml(value: Any) -> str:
    text = json.dumps(value)
    return f"'{text}'" if " " in text or '"' in text else text


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
