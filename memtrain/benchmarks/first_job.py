"""The README's first command -> its training time with memtrain and with a plain numpy loop of the same model.

The job is ``jobs/examples/digits-mlp.toml`` on the shipped ``data/digits.csv``: an MLP 64 -> 64 -> 10
(ReLU), batch 128, Adam, 30 epochs, 390 updates, validation every epoch. memtrain runs it through
``train`` as the command does (placement decided at start, versioned weight files, logs, checkpoints);
the loop is what a user writes by hand: the data in memory, normalized once, one gradient per batch,
memtrain's own MLP and Adam so that the arithmetic is the same, the validation loss after every epoch.
Each runs in a fresh process, timed from outside by the harness (train_bench.py) as a user's command is:
interpreter, imports, memtrain's start-up (the dataset opened and checked, a new run directory, the
model's dry run, the placement's trial) and the loop's (reading the data and normalizing it) are on the
clock of the whole run; a run of twice the epochs gives the cost of the epochs alone, start-up cancelled
on both sides. (Until issue 32 memtrain was timed from the call of ``train``, start-up included, and
the loop from its first update, start-up left out.)
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import MemtrainError

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "jobs" / "examples" / "digits-mlp.toml"
SOURCE = ROOT / "data" / "digits.csv"


def available() -> bool:
    """The job file and the data ship with the repository, not with an installed package."""
    return JOB.exists() and SOURCE.exists()


def prepare_digits(scratch: Path) -> Path:
    from memtrain.cli import main

    out = scratch / "digits"
    said = io.StringIO()
    with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
        code = main(["prepare", str(SOURCE), str(out), "--overwrite"])
    if code != 0:
        raise MemtrainError("memtrain prepare of data/digits.csv failed", found=said.getvalue()[-2000:])
    return out


def epochs() -> int:
    """The job's epochs, as shipped (30)."""
    from memtrain.config import load_job

    return load_job(JOB).train.epochs


def _overrides(dataset: Path, epochs: int | None) -> list[str]:
    return [f'data.path="{dataset}"'] + ([f"train.epochs={epochs}"] if epochs is not None else [])


def run_memtrain(dataset: Path, run_dir: Path, epochs: int | None = None) -> dict[str, Any]:
    from memtrain.config import load_job
    from memtrain.train.server.server import train

    job = load_job(JOB, _overrides(dataset, epochs), run_dir=run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)  # the command's first run makes a new run directory
    started = time.perf_counter()
    summary = train(job)
    seconds = time.perf_counter() - started
    events = (run_dir / "events.log").read_text(encoding="utf-8").splitlines()
    return {"seconds": seconds, "version": summary.version, "updates": summary.version,
            "rows": _train_rows(dataset) * job.train.epochs, "final": summary.final,
            "rounds": [line.split(" ", 1)[1] for line in events if "rounds:" in line]}


def run_loop(dataset: Path, epochs: int | None = None) -> dict[str, Any]:
    """The same training as a plain loop in this process (``epochs`` epochs; default: the job's)."""
    from memtrain.config import load_job
    from memtrain.dataset import open_dataset
    from memtrain.train.context import model_context
    from memtrain.train.optim import apply_update, learning_rate, state_names
    from memtrain.train.plan import updates_per_epoch
    from memtrain.train.server.server import job_plan

    job = load_job(JOB, _overrides(dataset, epochs))
    data = open_dataset(dataset)
    context = model_context(data, job.model.kind, job.model.options, job.data.normalize)
    layout, model, opt = context.layout, context.model, job.train.optimizer
    rows = data.split("train").rows
    x, y = data.split("train").read(0, rows)
    x, y = context.normalize(x), np.asarray(y)
    xv, yv = data.split("val").read(0, data.split("val").rows)
    xv, yv = context.normalize(xv), np.asarray(yv)
    weights = layout.flatten(model.init(np.random.default_rng(job.train.seed)))
    state = {name: np.zeros_like(weights) for name in state_names(opt)}
    grad, new_weights = np.empty_like(weights), np.empty_like(weights)
    new_state = {name: np.empty_like(weights) for name in state}
    total = updates_per_epoch(rows, job.train.batch_size) * job.train.epochs
    plan = job_plan(dataclasses.replace(job, train=dataclasses.replace(job.train, tasks_per_update=1)), rows)
    started = time.perf_counter()
    step = 0
    for epoch in range(job.train.epochs):
        for update in plan.updates(epoch):  # the job's order (train.shuffle), in one task per update
            lo, hi = update.tasks[0].lo, update.tasks[-1].hi
            index = plan.rows(epoch, lo, hi)
            xs, ys = (x[index.start:index.stop], y[index.start:index.stop]) if isinstance(index, range) else \
                (x[index], y[index])
            model.loss_and_grad(layout.views(weights), xs, ys, layout.views(grad))
            grad /= np.float32(hi - lo)
            apply_update(opt, step + 1, learning_rate(opt, step, total), weights, grad, state, new_weights, new_state)
            weights, new_weights, state, new_state, step = new_weights, weights, new_state, state, step + 1
        val_loss = float(model.loss(layout.views(weights), xv, yv)) / len(yv)
    seconds = time.perf_counter() - started
    accuracy = float(np.mean(model.predict(layout.views(weights), xv) == yv))
    return {"seconds": seconds, "updates": step, "rows": rows * job.train.epochs,
            "final": {"val_loss": val_loss, "val_accuracy": accuracy}}


def _train_rows(dataset: Path) -> int:
    from memtrain.dataset import open_dataset

    return open_dataset(dataset).split("train").rows
