"""A job run in the server -> the CPU time of each item of an update, in microseconds per update.

``python -m benchmarks.first_job_items JOB.toml [memtrain train options]`` runs ``memtrain train``
in this process with each piece of the rounds wrapped (the model's gradient, a task's rows, the step,
readying and publishing the version file, the board, the server's chores, the evaluation and checkpoints
per epoch) and prints the thread CPU time each took, summed over the run and divided by its updates.
CPU time, not wall time: on a loaded machine a piece's wall time holds whatever ran meanwhile, its CPU
time does not, so the items of two code versions compare on a busy machine (the wrappers add about 1 µs a
call). It measures the rounds the server runs itself: use it with ``train.workers = 0`` or "auto" on a job
whose updates stay in the server (the README's first job, the 1e4 and 1e5 bench MLPs).
"""

from __future__ import annotations

import functools
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memtrain.files import read_jsonl
from memtrain.layout import RUN_METRICS

# (owner module path, attribute path, item): the pieces wrapped, in the order printed
ITEMS = (
    ("memtrain.models.mlp", "MLP.loss_and_grad", "the model's loss and gradient"),
    ("memtrain.train.loops.gradient", "TaskGradient.__call__", "a gradient task (the model's included)"),
    ("memtrain.train.loops.mapped", "RoundFiles.rows", "the tasks' rows: read and normalized"),
    ("memtrain.train.loops.rounds", "reduce_and_step", "the step: sum, mean, optimizer, block digests"),
    ("memtrain.train.loops.rounds", "Participant.ready", "version file: readying (the retired one recycled)"),
    ("memtrain.train.loops.rounds", "Participant.publish", "version file: publication (digest, record, rename)"),
    ("memtrain.train.exchange.marks", "Board.doing", "the board: marks, activity words, waits"),
    ("memtrain.train.exchange.marks", "Board.mark_step", "the board: marks, activity words, waits"),
    ("memtrain.train.exchange.marks", "Board.mark_gradients", "the board: marks, activity words, waits"),
    ("memtrain.train.exchange.marks", "Board.mark_ready", "the board: marks, activity words, waits"),
    ("memtrain.train.exchange.marks", "Board.wait_step", "the board: marks, activity words, waits"),
    ("memtrain.train.exchange.marks", "Board.wait_gradients", "the board: marks, activity words, waits"),
    ("memtrain.train.exchange.marks", "Board.set_ledger", "the board: marks, activity words, waits"),
    ("memtrain.train.server.server", "Trainer.stretch_chores", "the server's chores between updates (logs, progress)"),
    ("memtrain.train.server.server", "Trainer.evaluate", "per epoch: evaluation"),
    ("memtrain.train.server.server", "save_checkpoint", "per epoch: checkpoints"),
    ("memtrain.train.server.server", "Trainer.end_epoch", "per epoch: all of the epoch's end"),
    ("memtrain.train.server.engines", "Rounds.run", "the rounds, in all"),
)


def wrap(module_name: str, attribute: str, add: Callable[[int], None]) -> None:
    module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    *path, name = attribute.split(".")
    owner: Any = module
    for part in path:
        owner = getattr(owner, part)
    function = getattr(owner, name)

    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            add(time.thread_time_ns() - started)

    setattr(owner, name, timed)


def main(argv: list[str]) -> int:
    from memtrain.cli import main as memtrain_main
    from memtrain.config import load_job

    spent: dict[str, int] = defaultdict(int)
    for module_name, attribute, item in ITEMS:
        wrap(module_name, attribute, lambda ns, item=item: spent.__setitem__(item, spent[item] + ns))
    started = time.process_time_ns()
    code = memtrain_main(["train", *argv])
    whole = time.process_time_ns() - started
    if code:
        return code
    sets = [value for flag, value in zip(argv, argv[1:], strict=False) if flag == "--set"]
    given = dict(zip(argv, argv[1:], strict=False)).get("--run-dir")
    run_dir = load_job(next(arg for arg in argv if arg.endswith(".toml")), sets, run_dir=given).run.dir
    updates = sum(1 for record in read_jsonl(Path(run_dir) / RUN_METRICS) if record.get("kind") == "update")
    print(f"{updates} updates; the server's CPU from the call of train: {whole / updates / 1e3:.1f} µs per update")
    for _, _, item in ITEMS:
        if item in spent:
            print(f"  {item:62s} {spent.pop(item) / updates / 1e3:8.1f} µs per update")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
