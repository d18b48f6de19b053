"""A job (a file, a dict or keyword arguments; or a run to resume) -> a trained run: ``memtrain.fit``.

It does what ``memtrain train`` does, from a script or a notebook: no ``if __name__ == "__main__":`` guard
is needed (train/worker/launch.py). The job's sections go through the same parser and checks as a job file
(memtrain/config.py), and the run records the resolved job (``job.json``) as it does for a file. Errors are
raised as ``memtrain.errors.MemtrainError`` with the text the command prints, their advice in Python terms
(``overwrite=True``, ``resume=...``) rather than command-line flags.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from memtrain.config import SECTIONS, load_job
from memtrain.errors import InputError, MemtrainError
from memtrain.train.records.run_dir import load_saved_job
from memtrain.train.server.server import TrainSummary, train

JobSource = str | os.PathLike[str] | Mapping[str, Mapping[str, Any]] | None


def fit(job: JobSource = None, *, resume: bool | str | os.PathLike[str] = False, workers: int | None = None,
        run_dir: str | os.PathLike[str] | None = None, overwrite: bool = False, verify: bool = False,
        quiet: bool = False, callbacks: Sequence[Any] = (), **sections: Mapping[str, Any]) -> TrainSummary:
    """Train a job, or resume a run; returns the run's summary (``print(summary)`` shows a short table).

    ``job``: a TOML job file, a dict of its sections (``{"data": {...}, "model": {...}, ...}``), or None
    with the sections as keyword arguments ``data``, ``model``, ``train`` and ``run`` (each a dict; with a
    file or dict, they override it key by key). Without a file, paths are relative to the current directory
    and the run goes to ``run_dir`` (or ``run={"dir": ...}``; default ``runs/default``).

    ``overwrite=True`` replaces the run directory of an earlier run; ``resume=True`` continues it (or starts
    it if it is new); ``resume="RUN_DIR"`` continues that run, where only the settings given here change.
    ``callbacks``: functions called as ``f(metrics)`` after each epoch (or objects with ``on_epoch_end``),
    ``metrics`` the epoch record (``epoch``, ``loss``, ``val_loss``, ...); one that raises stops the run
    with a checkpoint, as a stop does. ``quiet=True`` shows no progress, no epoch lines and no notes (a note,
    such as advice on ``train.batch_size``, is still in the run's ``events.log``).

    >>> import memtrain
    >>> summary = memtrain.fit(data={"path": "data/digits"}, model={"kind": "mlp", "hidden": [64]},
    ...                        train={"epochs": 5, "batch_size": 128}, run_dir="runs/nb")  # doctest: +SKIP
    >>> summary.final["val_accuracy"], summary.run_dir                                     # doctest: +SKIP
    >>> memtrain.fit(resume="runs/nb", train={"epochs": 10})   # train on to epoch 10       # doctest: +SKIP
    """
    if overwrite and resume:
        raise InputError("overwrite and resume contradict each other",
                         hint="overwrite=True starts the run over; resume=... continues it")
    if not isinstance(resume, bool | str | os.PathLike):
        raise InputError("resume= takes True or a run directory", found=type(resume).__name__)
    values = _dotted(sections)
    epoch_callbacks = _callbacks(callbacks)
    if isinstance(resume, str | os.PathLike):
        if job is not None or run_dir is not None:
            raise InputError("resume=RUN_DIR continues that run: give no job and no run_dir with it",
                             hint=f"memtrain.fit(resume={os.fspath(resume)!r}), with the settings to change")
        loaded = load_saved_job(resume, workers=workers, values=values)
    elif job is None and not values and not resume:
        raise InputError("a job is needed", hint='memtrain.fit("job.toml"), memtrain.fit(data={...}, model={...}), '
                                                 'or memtrain.fit(resume="RUN_DIR")')
    elif isinstance(job, Mapping):
        loaded = load_job(None, workers=workers, run_dir=run_dir, values=_dotted(job, what="job") | values)
    else:
        loaded = load_job(job, workers=workers, run_dir=run_dir, values=values)
    try:
        return train(loaded, resume_run=bool(resume), verify=verify, overwrite=overwrite, asked=set(values),
                     quiet=quiet, callbacks=epoch_callbacks,
                     say=lambda note: print(f"memtrain.fit: note: {python_advice(note, job)}", file=sys.stderr))
    except MemtrainError as exc:
        if exc.message == "the run directory already exists":  # a notebook cell run again
            exc.hint = ("pass overwrite=True to start it over, or resume=True to continue it (changing only the "
                        "settings given); or choose another run_dir=")
        exc.hint = python_advice(exc.hint, job)
        raise


def _dotted(sections: Mapping[str, Any], what: str = "keyword argument") -> dict[str, Any]:
    """``{"train": {"lr": 0.1}}`` -> ``{"train.lr": 0.1}``, each section a table of settings."""
    values = {}
    for section, table in sections.items():
        if section not in SECTIONS:
            form = f"{section}=" if what == "keyword argument" else repr(section)
            raise InputError(f"unknown {what} {form}", expected=f"one of {', '.join(SECTIONS)} (a table of settings)"
                             + (", or resume, workers, run_dir, overwrite, verify, quiet, callbacks"
                                if what == "keyword argument" else ""))
        if not isinstance(table, Mapping):
            raise InputError(f"{section}= takes a table of settings", expected=f'e.g. {section}={{"key": value}}',
                             found=type(table).__name__)
        values.update({f"{section}.{key}": value for key, value in table.items()})
    return values


def _callbacks(callbacks: Sequence[Any]) -> list[Any]:
    if callable(callbacks) or isinstance(callbacks, str) or not isinstance(callbacks, Sequence):
        raise InputError("callbacks= takes a list", expected="e.g. callbacks=[print]", found=type(callbacks).__name__)
    for callback in callbacks:
        if not callable(callback) and not callable(getattr(callback, "on_epoch_end", None)):
            raise InputError("a callback is neither a function nor an object with on_epoch_end(metrics)",
                             found=repr(callback))
    return list(callbacks)


# The command lines that errors suggest, as the same advice for memtrain.fit.
_RESUME = re.compile(r"`?memtrain train --resume (\S+?)((?: --set [\w.]+=\S+?)*)`?(?=[;,.]?(?:\s|$))")
_OVERWRITE = re.compile(r"`?memtrain train \S+ --run-dir (\S+?) --overwrite`?")
_NEW_DIR = re.compile(r"`?(?:memtrain train (?:JOB\.toml|\S+\.toml) )?--run-dir NEW_DIR`?")
_SET = re.compile(r" --set ([\w]+)\.([\w]+)=(\S+)")
_LONE_SET = re.compile(r"--set (\w+)\.(\w+)=([^\s:;,)]+)")  # a setting to try (a note's advice), not a resume


def python_advice(hint: str | None, job: JobSource) -> str | None:
    """A hint's ``memtrain train`` command lines, said in ``memtrain.fit`` terms."""
    if not hint:
        return hint

    def resume(match: re.Match[str]) -> str:
        changes: dict[str, list[str]] = {}
        for section, key, value in _SET.findall(match.group(2)):
            changes.setdefault(section, []).append(f"{key!r}: {value.strip(chr(39))}")
        extra = "".join(f", {section}={{{', '.join(items)}}}" for section, items in changes.items())
        return f"`memtrain.fit(resume={match.group(1)!r}{extra})`"

    first = repr(os.fspath(job)) if isinstance(job, str | os.PathLike | Path) else "..."
    hint = _RESUME.sub(resume, hint)
    hint = _OVERWRITE.sub(lambda m: f"`memtrain.fit({first}, run_dir={m.group(1)!r}, overwrite=True)`", hint)
    hint = _NEW_DIR.sub(f"`memtrain.fit({first}, run_dir=NEW_DIR)`", hint)
    hint = _LONE_SET.sub(lambda m: f"{m.group(1)}={{{m.group(2)!r}: {m.group(3)}}}", hint)
    return hint.replace("choose another with --run-dir", "choose another with run_dir=").replace(
        "to replace it: --overwrite", "to replace it: overwrite=True")

