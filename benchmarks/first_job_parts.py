"""The README's first command -> where its time goes, from a plain loop up to memtrain, each step measured.

    python -m benchmarks.first_job_parts [--repeats N]

Loops in this process, each adding one thing that memtrain does by its plan or its guarantees:

1. the plain loop of ``first_job.run_loop``: one gradient per batch, Adam in memory;
2. (a) the job's tasks: ``train.tasks_per_update`` gradients per update (two half batches for this job),
   added in task order, their mean stepped by Adam -- the arithmetic memtrain's fixed plan asks for; (b) the
   same stepped by memtrain's own step (``reduce_and_step``: also the finiteness check and the block digests
   that the version's checksum is made of). Each is checked to end on memtrain's last version, bitwise;
3. the same, the step writing each version into its own file, published by a rename with its checksum
   (``weights.ready_building`` / ``commit_weights``, as the rounds do): a loop that only steps and publishes.

Then the per-epoch pieces alone (memtrain's evaluation: loss, predictions and statistics; a checkpoint
with its fsyncs), and memtrain's own run (``first_job.run_memtrain``), split by the times its
``metrics.jsonl`` records: start-up, the updates, the gaps between epochs, the end. The measurements take
turns, ``--repeats`` rounds after one not counted (imports, first page faults); each figure is the median
run's (the lower of the middle two for an even count), memtrain's parts those of its median run.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.benchmarks import first_job
from memtrain.files import DIGEST_BYTES, read_jsonl
from memtrain.layout import RUN_LINEAGE, RUN_METRICS, WEIGHTS_DIR
from memtrain.train.exchange.weights import (
    array_checksum,
    block_count,
    commit_weights,
    publish_weights,
    ready_building,
    weights_checksum,
)
from memtrain.train.loops.maps import MapCache
from memtrain.train.loops.reduce import Scratch, reduce_and_step
from memtrain.train.optim import apply_update, learning_rate, state_names
from memtrain.train.plan import Plan
from memtrain.train.records.checkpoint import write_checkpoint
from memtrain.train.records.metrics import combine, task_statistics


class Problem:
    """The first command's job, data (normalized in memory, as the plain loop holds it) and model."""

    def __init__(self, dataset: Path):
        from memtrain.config import load_job
        from memtrain.dataset import open_dataset
        from memtrain.train.context import model_context

        self.job = load_job(first_job.JOB, [f'data.path="{dataset}"'])
        data = open_dataset(dataset)
        self.context = model_context(data, self.job.model.kind, self.job.model.options, self.job.data.normalize)
        train, val = data.split("train"), data.split("val")
        x, y = train.read(0, train.rows)
        self.x, self.y = self.context.normalize(x), np.asarray(y)
        xv, yv = val.read(0, val.rows)
        self.xv, self.yv = self.context.normalize(xv), np.asarray(yv)
        t = self.job.train
        self.plan = Plan(train.rows, t.batch_size, t.tasks_per_update, t.seed, t.epochs, shuffle=t.shuffle,
                         window=t.shuffle_window)
        self.size = self.context.layout.size

    def init(self) -> np.ndarray:
        return self.context.layout.flatten(self.context.model.init(np.random.default_rng(self.job.train.seed)))


def tasks_loop(problem: Problem, *, memtrain_step: bool = True, run_dir: Path | None = None) -> dict[str, Any]:
    """The job's tasks per update; ``memtrain_step`` False: their mean stepped by the optimizer alone (2a), True:
    by memtrain's step (2b); ``run_dir``: each version a file published there (3). Returns the seconds and the
    checksum of the last version (the lineage's, from the step's block digests or hashed from memory)."""
    layout, model, opt = problem.context.layout, problem.context.model, problem.job.train.optimizer
    size, plan, keep = problem.size, problem.plan, problem.job.run.keep_versions
    grads = [np.empty(size, np.float32) for _ in range(plan.tasks_per_update)]
    states = [{name: np.zeros(size, np.float32) for name in state_names(opt)} for _ in (0, 1)]
    digests = np.zeros((block_count(size), DIGEST_BYTES), np.uint8)
    scratch, maps = Scratch(), MapCache()
    weights, spare = problem.init(), np.empty(size, np.float32)
    if run_dir is not None:
        (run_dir / WEIGHTS_DIR).mkdir(parents=True)
        publish_weights(run_dir, 0, weights)
    started = time.perf_counter()
    version = 0
    for epoch in range(plan.epochs):
        for update in plan.updates(epoch):
            for task in update.tasks:
                index = plan.rows(epoch, task.lo, task.hi)  # the job's order: a range, or one gather
                index = slice(index.start, index.stop) if isinstance(index, range) else index
                model.loss_and_grad(layout.views(weights), problem.x[index], problem.y[index],
                                    layout.views(grads[task.task]))
            out, path = spare, None
            if run_dir is not None:
                path = ready_building(run_dir, version + 1, size, os.getpid(), keep, fast=version > 0)
                out = maps.get(path, (size,), np.float32, "r+")
            lr = learning_rate(opt, update.update, plan.total_updates)
            if memtrain_step:  # mean, optimizer, finiteness check and block digests, chunk by chunk
                reduce_and_step(grads=grads[:len(update.tasks)], rows=update.rows, weights=weights,
                                state_in=states[version % 2], weights_out=out, state_out=states[1 - version % 2],
                                lo=0, hi=size, optimizer=opt, step=version + 1, lr=lr, digests=digests,
                                trainable=layout.trainable, scratch=scratch)
                checksum = weights_checksum(digests, size)  # what the lineage records for the version
            else:  # the same sum in task order, mean and optimizer step, nothing else
                mean = np.add(grads[0], grads[1], out=scratch.mean[:size]) if len(update.tasks) == 2 else \
                    np.sum(grads[:len(update.tasks)], axis=0, dtype=np.float32)
                np.divide(mean, np.float32(update.rows), out=mean)
                apply_update(opt, version + 1, lr, weights, mean, states[version % 2], out, states[1 - version % 2])
            if path is not None:
                commit_weights(path, run_dir, version + 1)
            else:
                spare = weights
            weights, version = out, version + 1
        float(model.loss(layout.views(weights), problem.xv, problem.yv))  # the validation loss, as the loop has it
    seconds = time.perf_counter() - started
    maps.close()
    return {"seconds": seconds, "checksum": checksum if memtrain_step else array_checksum(weights), "updates": version}


def evaluation(problem: Problem, weights: np.ndarray) -> float:
    """One epoch's evaluation as memtrain does it in the server: the loss, the predictions (accuracy) and
    the statistics (predictions and probabilities: macro F1, log loss) of the validation rows."""
    context, params = problem.context, problem.context.layout.views(weights)
    started = time.perf_counter()
    float(context.model.loss(params, problem.xv, problem.yv))
    predicted = context.model.predict(params, problem.xv)
    int(np.count_nonzero(predicted == problem.yv))
    combine([task_statistics(context, params, problem.xv, problem.yv, predicted=predicted)], context)
    return time.perf_counter() - started


def checkpoint(problem: Problem, folder: Path, update: int) -> float:
    """One checkpoint of the job's files (weights and Adam's two state vectors), with its fsyncs."""
    folder.mkdir(exist_ok=True)
    files = {name: folder / f"{name}.npy" for name in ("weights", *state_names(problem.job.train.optimizer))}
    for path in files.values():
        if not path.exists():
            np.save(path, problem.init())
    weights = files.pop("weights")
    started = time.perf_counter()
    write_checkpoint(folder, update, {"update": update}, weights, files, problem.job.run.keep_checkpoints)
    return time.perf_counter() - started


def memtrain_parts(dataset: Path, run_dir: Path) -> dict[str, float]:
    """memtrain's run, split by its metrics.jsonl: start-up (the call to the first update's record, less
    one median update), the updates, the gaps between epochs (less one update each), after the last update."""
    result = first_job.run_memtrain(dataset, run_dir)
    returned = time.time()
    records = read_jsonl(run_dir / RUN_METRICS)
    times = [r["time"] for r in records if r["kind"] == "update"]
    epochs = [r["epoch"] for r in records if r["kind"] == "update"]
    gaps = [b - a for a, b, ea, eb in zip(times, times[1:], epochs, epochs[1:], strict=False) if ea == eb]
    update = statistics.median(gaps)
    between = [b - a - update for a, b, ea, eb in zip(times, times[1:], epochs, epochs[1:], strict=False) if ea != eb]
    parts = {"updates": sum(gaps) + update * (len(between) + 1), "between epochs": sum(between),
             "after the last update": returned - times[-1]}
    return {"total": result["seconds"], "start-up": result["seconds"] - sum(parts.values()), **parts,
            "median update": update,
            "checksum": read_jsonl(run_dir / RUN_LINEAGE)[-1]["checksum"]}


def measure(dataset: Path, scratch: Path, repeats: int) -> dict[str, Any]:
    problem = Problem(dataset)
    epochs = problem.plan.epochs
    checkpoints = len(range(problem.job.run.checkpoint_every - 1, epochs, problem.job.run.checkpoint_every))
    parts: list[dict[str, float]] = []
    checksums = set()

    def loop(i: int, memtrain_step: bool = True, run_dir: Path | None = None) -> float:
        result = tasks_loop(problem, memtrain_step=memtrain_step, run_dir=run_dir)
        checksums.add(result["checksum"])
        return result["seconds"]

    def memtrain(i: int) -> float:
        part = memtrain_parts(dataset, scratch / f"memtrain-{i}")
        checksums.add(part["checksum"])
        if i >= 0:
            parts.append(part)
        return part["total"]

    final = problem.init()  # the evaluation's cost does not depend on the weights' values
    methods: dict[str, Callable[[int], float]] = {
        "loop": lambda i: first_job.run_loop(dataset)["seconds"],
        "tasks": lambda i: loop(i, memtrain_step=False),
        "step": loop,
        "published": lambda i: loop(i, run_dir=scratch / f"published-{i}"),
        "evaluation": lambda i: sum(evaluation(problem, final) for _ in range(epochs)),
        "loop evaluation": lambda i: sum(_loop_evaluation(problem, final) for _ in range(epochs)),
        "checkpoints": lambda i: sum(checkpoint(problem, scratch / f"checkpoints-{i}", 1 + k)
                                     for k in range(checkpoints)),
        "memtrain": memtrain}
    runs: dict[str, list[float]] = {name: [] for name in methods}
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):  # memtrain's lines
        for i in range(-1, repeats):  # the methods take turns, so that a change of load touches them all
            for name, seconds in methods.items():
                taken = seconds(i)
                if i >= 0:  # the first round is not counted: imports, first page faults
                    runs[name].append(taken)
    median_run = sorted(parts, key=lambda p: p["total"])[(len(parts) - 1) // 2]  # as statistics.median_low
    return {"runs": runs, "parts": median_run,
            "same_weights": len(checksums) == 1, "updates": problem.plan.total_updates, "epochs": epochs,
            "checkpoints": checkpoints, "tasks_per_update": problem.plan.tasks_per_update}


def _loop_evaluation(problem: Problem, weights: np.ndarray) -> float:
    started = time.perf_counter()
    float(problem.context.model.loss(problem.context.layout.views(weights), problem.xv, problem.yv))
    return time.perf_counter() - started


def report(measured: dict[str, Any]) -> str:
    runs, parts, updates = measured["runs"], measured["parts"], measured["updates"]
    med = {name: statistics.median_low(values) for name, values in runs.items()}

    def line(label: str, seconds: float, spread: list[float] | None = None, note: str = "") -> str:
        span = f"  runs {min(spread):.4f}-{max(spread):.4f}" if spread and len(spread) > 1 else ""
        return f"  {label:<62} {seconds:8.4f} s {seconds / updates * 1e3:7.3f} ms/update{span}{note}"

    same = "yes" if measured["same_weights"] else "NO"
    lines = [f"the README's first command: {updates} updates, {measured['epochs']} epochs "
             f"(medians of {len(runs['loop'])} runs)",
             line("1. plain numpy loop (one gradient per batch)", med["loop"], runs["loop"]),
             line(f"2a. the job's {measured['tasks_per_update']} tasks per update, their mean stepped", med["tasks"],
                  runs["tasks"], f"  (+{med['tasks'] - med['loop']:.4f} s)"),
             line("2b. memtrain's step instead (finiteness check, block digests)", med["step"], runs["step"],
                  f"  (+{med['step'] - med['tasks']:.4f} s)"),
             line("3. + each version a file, published by rename", med["published"], runs["published"],
                  f"  (+{med['published'] - med['step']:.4f} s)"),
             line(f"evaluation x {measured['epochs']}: memtrain's (the loop's: {med['loop evaluation']:.4f} s)",
                  med["evaluation"], runs["evaluation"]),
             line(f"checkpoint x {measured['checkpoints']} (3 files, fsyncs)", med["checkpoints"],
                  runs["checkpoints"]),
             line("memtrain's own run (first_job.run_memtrain)", med["memtrain"], runs["memtrain"],
                  f"  ({med['loop'] / med['memtrain']:.2f}x the plain loop)")]
    lines += [line(f"   {key}", parts[key]) for key in ("start-up", "updates", "between epochs",
                                                         "after the last update")]
    lines.append(f"  (memtrain's median update: {parts['median update'] * 1e3:.3f} ms; step 3's: "
                 f"{med['published'] / updates * 1e3:.3f} ms)")
    lines.append(f"  loops 2a, 2b and 3 end on the weights of memtrain's last version (its lineage checksum): {same}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.first_job_parts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5, help="runs of each measurement (default %(default)s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="memtrain-first-job-") as folder:
        scratch = Path(folder)
        dataset = first_job.prepare_digits(scratch)
        print(report(measure(dataset, scratch, max(1, args.repeats))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
