"""A job run in the server -> the CPU time of each item of an update, in microseconds per update.

``python -m benchmarks.first_job_items JOB.toml [memtrain train options]`` runs ``memtrain train`` in this
process with a timer of the server's named sections (memtrain/train/timing.py: the model's gradient, a
gradient task, a task's rows, the step, readying and publishing the version file, the server's chores
between updates, the evaluation and the end of each epoch, the rounds in all) and prints the thread CPU time
each took, summed over the run and divided by its updates. Nothing is patched: the timer is handed to
``train``, and the parts time their own sections with it. CPU time, not wall time: on a loaded machine a
piece's wall time holds whatever ran meanwhile, its CPU time does not, so the items of two code versions
compare on a busy machine (the timer adds about 1 µs a call). It measures the rounds the server runs
itself: use it with ``train.workers = 0`` or "auto" on a job whose updates stay in the server (the README's
first job, the 1e4 and 1e5 bench MLPs).

The fixed cost without the model: with ``model.kind = "benchmarks.first_job_items:ZeroGradientMLP"`` (run from the
checkout's root) the job has the MLP's parameters and the same step, records, logs and version files, but its
gradient is zeros written into the buffers, so "the rounds, in all" less "the model's loss and gradient" is
memtrain's own work per update, without the model's compute and without its cache effects (the model's rows and
activations evict the interpreter's working set, which makes the Python after it slower: docs/performance.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from memtrain.files import read_jsonl
from memtrain.layout import RUN_METRICS
from memtrain.models.mlp import MLP
from memtrain.train.timing import Recording

# (named section, item): the sections timed, in the order printed
ITEMS = (
    ("model", "the model's loss and gradient"),
    ("gradient task", "a gradient task (the model's included)"),
    ("rows", "the tasks' rows: read and normalized"),
    ("step", "the step: sum, mean, optimizer, block digests"),
    # no "ready": the server alone readies its ring's version files once per stretch, not per update (timing.SECTIONS)
    ("publish", "version file: publication (digest, record, rename)"),
    ("stretch_chores", "the server's chores between updates (logs, progress)"),
    ("evaluate", "per epoch: evaluation"),
    ("end_epoch", "per epoch: all of the epoch's end"),
    ("rounds", "the rounds, in all"),
)


@dataclass(frozen=True)
class ZeroGradientMLP(MLP):
    """The MLP's parameters, a gradient of zeros and a loss of 1 per task (see the module's text)."""

    def loss_and_grad(self, params: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray,
                      grads: dict[str, np.ndarray]) -> float:
        for grad in grads.values():
            grad.fill(0)
        return 1.0


def main(argv: list[str]) -> int:
    from memtrain.config import load_job
    from memtrain.train.server.command import add_arguments, run

    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_job_items")
    add_arguments(parser)
    args = parser.parse_args(argv)
    timer = Recording(clock=time.thread_time)
    started = time.process_time_ns()
    code = run(args, timer=timer)
    whole = time.process_time_ns() - started
    if code:
        return code
    run_dir = load_job(args.job, args.overrides, run_dir=args.run_dir).run.dir
    updates = sum(1 for record in read_jsonl(Path(run_dir) / RUN_METRICS) if record.get("kind") == "update")
    print(f"{updates} updates; the server's CPU from the call of train: {whole / updates / 1e3:.1f} µs per update")
    for section, item in ITEMS:
        if timer.times.get(section):
            print(f"  {item:62s} {sum(timer.times[section]) * 1e6 / updates:8.1f} µs per update")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
