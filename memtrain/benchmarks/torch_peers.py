"""A benchmark problem -> per-update times of the torch MLP: memtrain, torch DDP on gloo, one all-core process.

All three train the same ``torch.nn.Module`` (features -> hidden -> classes, Linear + ReLU), built by
``benchmark_mlp`` under ``torch.manual_seed(problem.seed)`` (so the same initial weights: memtrain's
version 0 is built the same way), on the same rows in the same order, with SGD at the same learning
rate on the mean loss of each global batch:

- memtrain: ``kind = "torch"`` through the real ``train`` path, ``problem.workers`` workers, one thread each;
- DDP: ``problem.workers`` ranks (spawned processes) on gloo over 127.0.0.1, one thread per rank, each
  rank the same half of the batch a memtrain task gets, ``torch.optim.SGD``; DDP averages the ranks'
  gradients, so each rank's loss is its sum scaled by ranks / batch rows;
- one process: the whole batch, torch on every core, ``torch.optim.SGD``.

Compute means the same for every method: forward + backward (memtrain: the slowest worker's gradient
task of the update; the optimizer step is overhead everywhere). DDP's is calibrated, not measured per
update (its all-reduce overlaps the backward pass): after the timed updates, warm, the ranks run a few
more under ``no_sync()``, starting together, and the slowest rank's forward + backward (median over
the updates) is its compute; the rest of an update is what DDP adds (the all-reduce, the waits, its step).
(Calibrating before the timed run measured the first, page-faulting allocations: at 1e7 it came out
longer than a whole timed update.)

The data is what a competent torch user has: each process (every DDP rank, the all-core process) opens the
dataset once, before its first update, and holds the training rows as tensors in memory, as a per-rank
``DataLoader`` over an in-memory dataset hands them; an update slices its rows (a view, no copy). (Until
issue 32 they opened the dataset again at every update, which inflated their overhead: 147 ms per update
for the all-core process at 1e5 parameters, against 6 ms of compute.) memtrain reads its rows from the
dataset's mapped shards, as it always does.

After every epoch each validates, as memtrain's job does: ``model.eval()`` and ``torch.no_grad()``, one
forward pass of the validation rows (in memory too, read with the training rows), their summed cross-entropy
and correct predictions. The all-core process evaluates every row; each DDP rank evaluates its contiguous
part of them (``split_range``, as memtrain cuts rows; ``DistributedSampler`` would stride them and pad the
last part with repeated rows) and one ``all_reduce`` adds the ranks' sums (loss, correct, rows).
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

import numpy as np

from memtrain.benchmarks.problem import Problem, Validation, timings, validated
from memtrain.dataset import Dataset, open_dataset
from memtrain.models.protocol import DataSpec
from memtrain.train.plan import split_range

CALIBRATION = 5  # no-sync updates each rank runs after timing, to estimate DDP's compute time
FACTORY = "memtrain.benchmarks.torch_peers:benchmark_mlp"


def benchmark_mlp(spec: DataSpec, hidden: int = 64) -> Any:
    """The benchmark MLP as a torch module (the factory memtrain's torch job names)."""
    from torch import nn

    return nn.Sequential(nn.Linear(spec.n_features, hidden), nn.ReLU(), nn.Linear(hidden, spec.n_classes))


def _module(problem: Problem, dataset: Dataset) -> Any:
    import torch

    from memtrain.train.context import data_spec

    torch.manual_seed(problem.seed)
    return benchmark_mlp(data_spec(dataset.manifest), problem.hidden)


def _in_memory(dataset: Dataset, split: str = "train") -> tuple[Any, Any]:
    """Every row of ``split`` as tensors in this process's memory (x float32, y int64): read once, before timing."""
    import torch

    rows = dataset.split(split)
    x, y = rows.read(0, rows.rows)
    return torch.from_numpy(np.array(x, dtype=np.float32)), torch.from_numpy(np.array(y, dtype=np.int64))


def _validate(module: Any, x: Any, y: Any) -> Validation:
    """Forward only (``eval()``, ``no_grad()``): the summed cross-entropy and the correct predictions of rows x, y."""
    import torch
    import torch.nn.functional as F

    module.eval()
    try:
        with torch.no_grad():
            scores = module(x)
            return Validation(loss=float(F.cross_entropy(scores, y, reduction="sum")),
                              correct=int((scores.argmax(dim=1) == y).sum()), rows=len(y))
    finally:
        module.train()


def _update(module: Any, optimizer: Any, x: Any, y: Any, scale: float) -> float:
    """One update (forward, backward, optimizer step); returns the seconds of its forward + backward."""
    spent = _gradient(module, optimizer, x, y, scale)
    optimizer.step()
    return spent


def _gradient(module: Any, optimizer: Any, x: Any, y: Any, scale: float) -> float:
    import torch.nn.functional as F

    started = time.perf_counter()
    optimizer.zero_grad()
    loss = F.cross_entropy(module(x), y, reduction="sum") * scale
    loss.backward()
    return time.perf_counter() - started


def all_cores(problem: Problem) -> dict[str, object]:
    """The whole batch in one process, torch on every core."""
    import torch

    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    dataset = open_dataset(problem.dataset)
    module = _module(problem, dataset)
    xs, ys = _in_memory(dataset)
    val_x, val_y = _in_memory(dataset, "val")
    optimizer = torch.optim.SGD(module.parameters(), lr=problem.optimizer.lr)
    walls, computes, passes, val_seconds = [], [], [], 0.0
    for update, (lo, hi) in enumerate(problem.batches()):
        started = time.perf_counter()
        computes.append(_update(module, optimizer, xs[lo:hi], ys[lo:hi], 1.0 / (hi - lo)))
        walls.append(time.perf_counter() - started)
        if problem.ends_epoch(update):
            started = time.perf_counter()
            passes.append(_validate(module, val_x, val_y))
            val_seconds += time.perf_counter() - started
    return validated(timings(walls, computes, threads=threads), passes, val_seconds)


def ddp(problem: Problem) -> dict[str, object]:
    """``problem.workers`` DDP ranks on gloo over loopback; rank 0's per-update times come back by a pipe."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    port = _free_port()
    receive, send = context.Pipe(duplex=False)
    ranks = [context.Process(target=_rank, args=(problem, rank, port, send if rank == 0 else None), daemon=True)
             for rank in range(problem.workers)]
    for process in ranks:
        process.start()
    try:
        result = receive.recv()
        for process in ranks:
            process.join(60)
    finally:
        for process in ranks:
            if process.is_alive():
                process.kill()
                process.join()
    if any(process.exitcode != 0 for process in ranks):
        raise RuntimeError(f"a DDP rank failed: exit codes {[p.exitcode for p in ranks]}")
    return result


def _rank(problem: Problem, rank: int, port: int, report: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=problem.workers)
    try:
        dataset = open_dataset(problem.dataset)
        model = DistributedDataParallel(_module(problem, dataset))
        xs, ys = _in_memory(dataset)
        val_x, val_y = _in_memory(dataset, "val")
        a, b = split_range(0, len(val_y), problem.workers)[rank]
        val_x, val_y = val_x[a:b], val_y[a:b]
        optimizer = torch.optim.SGD(model.parameters(), lr=problem.optimizer.lr)
        walls, passes, val_seconds = [], [], 0.0
        dist.barrier()
        for update, (lo, hi) in enumerate(problem.batches()):
            started = time.perf_counter()
            a, b = problem.pieces(lo, hi)[rank]
            _update(model, optimizer, xs[a:b], ys[a:b], problem.workers / (hi - lo))
            walls.append(time.perf_counter() - started)
            if problem.ends_epoch(update):
                started = time.perf_counter()
                passes.append(_all_ranks(_validate(model.module, val_x, val_y)))
                val_seconds += time.perf_counter() - started
        compute = _calibrate(problem, model, optimizer, rank, (xs, ys))
        if report is not None:
            report.send(validated(timings(walls, [compute] * len(walls), ranks=problem.workers, backend="gloo",
                                          compute_from="no_sync calibration"), passes, val_seconds))
        dist.barrier()  # no rank tears its pairs down while another still uses them
    finally:
        dist.destroy_process_group()
    # Out without the interpreter's teardown: under torch 2.13 a gloo rank's exit sometimes aborted in a
    # C++ destructor ("terminate called without an active exception", exit -6) after all its work was done.
    os._exit(0)


def _all_ranks(part: Validation) -> Validation:
    """This rank's part of a validation pass -> the whole pass: one ``all_reduce`` (sum) of (loss, correct, rows)."""
    import torch
    import torch.distributed as dist

    sums = torch.tensor([part.loss, part.correct, part.rows], dtype=torch.float64)
    dist.all_reduce(sums)
    return Validation(loss=float(sums[0]), correct=int(sums[1]), rows=int(sums[2]))


def _calibrate(problem: Problem, model: Any, optimizer: Any, rank: int, data: tuple[Any, Any]) -> float:
    """DDP's compute, measured as memtrain's is: per update, the slowest rank's forward + backward (the
    ranks start together at a barrier; no communication inside the timed part, under ``no_sync()``), median
    of CALIBRATION updates on each rank's rows of the first batch. The optimizer step is left out (it is
    not compute in memtrain's figure either: its step is in its overhead). Run after the timed updates,
    warm: the weights it changes are not used any more."""
    import torch
    import torch.distributed as dist

    lo, hi = problem.batches()[0]
    a, b = problem.pieces(lo, hi)[rank]
    x, y = data[0][a:b], data[1][a:b]
    times = []
    with model.no_sync():
        for _ in range(CALIBRATION):
            dist.barrier()
            slowest = torch.tensor([_gradient(model, optimizer, x, y, problem.workers / (hi - lo))],
                                   dtype=torch.float64)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            times.append(float(slowest))
    return sorted(times)[len(times) // 2]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
