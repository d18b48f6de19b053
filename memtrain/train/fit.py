"""A job file (or a run to resume) + Python overrides -> a trained run: ``memtrain.fit``, the Python entry point.

It does what ``memtrain train`` does, from a script or a notebook: no ``if __name__ == "__main__":`` guard
is needed (train/launch.py). Errors are raised as ``memtrain.errors.MemtrainError`` with the same text the
command prints.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from memtrain.config import SECTIONS, load_job, load_saved_job
from memtrain.errors import InputError
from memtrain.train.server import TrainSummary, train


def fit(job: str | os.PathLike[str] | None = None, *, resume: str | os.PathLike[str] | None = None,
        workers: int | None = None, run_dir: str | os.PathLike[str] | None = None, overwrite: bool = False,
        verify: bool = False, quiet: bool = False, **sections: Mapping[str, Any]) -> TrainSummary:
    """Train the job in a TOML file, or resume a run; returns the run's summary.

    Settings override the file by section, as keyword arguments named ``data``, ``model``, ``train`` and
    ``run``; paths given here are relative to the current directory (paths in the file, to the file).

    >>> import memtrain
    >>> summary = memtrain.fit("jobs/examples/digits-mlp.toml", train={"epochs": 5}, workers=2)  # doctest: +SKIP
    >>> summary.final["val_accuracy"], summary.run_dir                                          # doctest: +SKIP
    >>> memtrain.fit(resume="runs/digits-mlp", train={"epochs": 10})   # train on to epoch 10  # doctest: +SKIP

    ``quiet=True`` shows no progress and no epoch lines; warnings are still printed.
    """
    values = _dotted(sections)
    if overwrite and resume is not None:
        raise InputError("overwrite and resume contradict each other")
    if resume is not None:
        if job is not None or run_dir is not None:
            raise InputError("give either a job file or resume=RUN_DIR, not both")
        loaded = load_saved_job(resume, workers=workers, values=values)
    elif job is None:
        raise InputError("a job file is needed", hint='memtrain.fit("job.toml"), or memtrain.fit(resume="RUN_DIR")')
    else:
        loaded = load_job(job, workers=workers, run_dir=run_dir, values=values)
    return train(loaded, resume_run=resume is not None, verify=verify, overwrite=overwrite, asked=set(values),
                 quiet=quiet)


def _dotted(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    values = {}
    for section, table in sections.items():
        if section not in SECTIONS:
            raise InputError(f"unknown keyword argument {section}=", expected=f"one of {', '.join(SECTIONS)} "
                             "(a table of settings), or resume, workers, run_dir, overwrite, verify, quiet")
        if not isinstance(table, Mapping):
            raise InputError(f"{section}= takes a table of settings", expected=f'e.g. {section}={{"key": value}}',
                             found=type(table).__name__)
        values.update({f"{section}.{key}": value for key, value in table.items()})
    return values
