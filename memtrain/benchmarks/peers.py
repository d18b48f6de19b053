"""A benchmark problem -> per-update wall and compute times of the peers memtrain is measured against.

one process (no workers, BLAS on 1 thread or on every core); pickling the weights and the batch through
``multiprocessing.Queue`` every update; ``multiprocessing.shared_memory`` holding the weights, the data
and one gradient slot per worker, synchronised with small messages. All use ``problem.Model``.

After every epoch each one evaluates the validation split with the new weights, as memtrain's job does
(forward only: the model's loss and predictions, ``Model.validate``), its rows read once, before the
first update: one process evaluates every row; the Queue and shared_memory peers split the rows as they
split a batch, each worker evaluates its part (the Queue's rows pickled to it with the weights, as its
batches are; shared_memory's in shared memory beside the training rows) and the server adds the
workers' sums in worker order. The workers, not the server: they already hold the model, their BLAS is
on one thread each, and two halves at once take half the time of one process evaluating everything.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Iterator
from multiprocessing import shared_memory
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from memtrain.benchmarks.problem import Model, Problem, Validation, timings, validated
from memtrain.train.plan import split_range


def one_process(problem: Problem, threads: int) -> dict[str, object]:
    """The whole batch in this process; BLAS on ``threads`` threads; every validation row after each epoch."""
    with threadpool_limits(limits=threads):
        model = Model(problem)
        weights, spare = model.initial(), np.empty(model.size, dtype=np.float32)
        grad = np.empty(model.size, dtype=np.float32)
        val_x, val_y = model.validation_rows()
        walls, computes, passes, val_seconds = [], [], [], 0.0
        for update, (lo, hi) in enumerate(problem.batches()):
            start = time.perf_counter()
            x, y = model.rows(lo, hi)
            _, compute = model.grad(weights, x, y, grad)
            model.step(update, weights, grad, hi - lo, spare)
            weights, spare = spare, weights
            walls.append(time.perf_counter() - start)
            computes.append(compute)
            if problem.ends_epoch(update):
                start = time.perf_counter()
                passes.append(model.validate(weights, val_x, val_y))
                val_seconds += time.perf_counter() - start
    return validated(timings(walls, computes, threads=threads), passes, val_seconds)


def _worker_pickle(problem: Problem, tasks: Any, results: Any) -> None:
    """A gradient for each (weights, x, y) message; a Validation for each ("validate", weights, x, y)."""
    with threadpool_limits(limits=1):
        model = Model(problem)
        while (message := tasks.get()) is not None:
            if isinstance(message[0], str):  # ("validate", ...)
                results.put(model.validate(*message[1:]))
                continue
            weights, x, y = message
            grad = np.empty(model.size, dtype=np.float32)
            loss, compute = model.grad(weights, x, y, grad)
            results.put((loss, grad, compute))


def pickle_queue(problem: Problem) -> dict[str, object]:
    """Each update: the weights and each worker's rows pickled into its Queue, gradients pickled back."""
    context = multiprocessing.get_context("spawn")
    queues = [(context.Queue(), context.Queue()) for _ in range(problem.workers)]
    with _processes(context, _worker_pickle, [(problem, t, r) for t, r in queues]) as stop:
        model = Model(problem)
        weights, spare = model.initial(), np.empty(model.size, dtype=np.float32)
        val_x, val_y = model.validation_rows()
        parts = split_range(0, len(val_y), problem.workers)
        walls, computes, passes, val_seconds = [], [], [], 0.0
        for update, (lo, hi) in enumerate(problem.batches()):
            start = time.perf_counter()
            for (tasks, _), (a, b) in zip(queues, problem.pieces(lo, hi), strict=True):
                x, y = model.rows(a, b)
                tasks.put((weights, np.asarray(x), np.asarray(y)))
            answers = [results.get() for _, results in queues]
            total = answers[0][1]
            for _, grad, _ in answers[1:]:
                np.add(total, grad, out=total)
            model.step(update, weights, total, hi - lo, spare)
            weights, spare = spare, weights
            walls.append(time.perf_counter() - start)
            computes.append(max(answer[2] for answer in answers))
            if problem.ends_epoch(update):
                start = time.perf_counter()
                for (tasks, _), (a, b) in zip(queues, parts, strict=True):
                    tasks.put(("validate", weights, val_x[a:b], val_y[a:b]))
                passes.append(sum((results.get() for _, results in queues), Validation()))
                val_seconds += time.perf_counter() - start
        stop(lambda index: queues[index][0].put(None))
    return validated(timings(walls, computes), passes, val_seconds)


def _worker_shm(problem: Problem, names: dict[str, str], slot: int, conn: Any) -> None:
    """A gradient of rows [lo, hi) for each (parity, lo, hi) message; a Validation of validation rows [lo, hi)
    for each ("validate", parity, lo, hi)."""
    with threadpool_limits(limits=1):
        model = Model(problem)
        rows, features = model.train.rows, model.context.spec.n_features
        val_rows = model.dataset.split("val").rows
        blocks = {key: shared_memory.SharedMemory(name=name) for key, name in names.items()}
        weights = np.ndarray((2, model.size), np.float32, blocks["w"].buf)
        xs = np.ndarray((rows, features), np.float32, blocks["x"].buf)
        ys = np.ndarray((rows,), np.int64, blocks["y"].buf)
        val_x = np.ndarray((val_rows, features), np.float32, blocks["vx"].buf)
        val_y = np.ndarray((val_rows,), np.int64, blocks["vy"].buf)
        grad = np.ndarray((problem.workers, model.size), np.float32, blocks["g"].buf)[slot]
        while (message := conn.recv()) is not None:
            if isinstance(message[0], str):  # ("validate", ...)
                _, parity, lo, hi = message
                conn.send(model.validate(weights[parity], val_x[lo:hi], val_y[lo:hi]))
                continue
            parity, lo, hi = message
            conn.send(model.grad(weights[parity], xs[lo:hi], ys[lo:hi], grad))
        del weights, xs, ys, val_x, val_y, grad
        for block in blocks.values():
            block.close()


def shared_memory_peer(problem: Problem) -> dict[str, object]:
    """Weights (two buffers, alternating), data and per-worker gradient slots in shared memory.

    Messages are (weight buffer, lo, hi) out and (loss, seconds) back; after each epoch ("validate", weight
    buffer, lo, hi) out, each worker's part of the validation rows, and its Validation back.
    """
    model = Model(problem)
    x_all, y_all = model.rows(0, model.train.rows)
    val_x, val_y = model.validation_rows()
    with _blocks({"w": 2 * model.size * 4, "x": x_all.nbytes, "y": y_all.nbytes, "vx": val_x.nbytes,
                  "vy": val_y.nbytes, "g": problem.workers * model.size * 4}) as blocks:
        weights = np.ndarray((2, model.size), np.float32, blocks["w"].buf)
        weights[0] = model.initial()
        for key, array in (("x", x_all), ("y", y_all), ("vx", val_x), ("vy", val_y)):
            np.ndarray(array.shape, array.dtype, blocks[key].buf)[:] = array
        grads = np.ndarray((problem.workers, model.size), np.float32, blocks["g"].buf)
        names = {key: block.name for key, block in blocks.items()}
        context = multiprocessing.get_context("spawn")
        pipes = [context.Pipe() for _ in range(problem.workers)]
        with _processes(context, _worker_shm, [(problem, names, k, pipes[k][1]) for k in range(problem.workers)]) \
                as stop:
            walls, computes, passes, val_seconds = _shm_loop(problem, model, weights, grads, [p[0] for p in pipes],
                                                             len(val_y))
            stop(lambda index: pipes[index][0].send(None))
        del weights, grads
    return validated(timings(walls, computes), passes, val_seconds)


def _shm_loop(problem: Problem, model: Model, weights: np.ndarray, grads: np.ndarray, conns: list[Any],
              val_rows: int) -> tuple[list[float], list[float], list[Validation], float]:
    total = np.empty(model.size, dtype=np.float32)
    walls, computes, passes, val_seconds = [], [], [], 0.0
    for update, (lo, hi) in enumerate(problem.batches()):
        start = time.perf_counter()
        for conn, piece in zip(conns, problem.pieces(lo, hi), strict=True):
            conn.send((update % 2, *piece))
        answers = [conn.recv() for conn in conns]
        np.copyto(total, grads[0])
        for k in range(1, problem.workers):
            np.add(total, grads[k], out=total)
        model.step(update, weights[update % 2], total, hi - lo, weights[1 - update % 2])
        walls.append(time.perf_counter() - start)
        computes.append(max(seconds for _, seconds in answers))
        if problem.ends_epoch(update):
            start = time.perf_counter()
            for conn, part in zip(conns, split_range(0, val_rows, problem.workers), strict=True):
                conn.send(("validate", 1 - update % 2, *part))
            passes.append(sum((conn.recv() for conn in conns), Validation()))
            val_seconds += time.perf_counter() - start
    return walls, computes, passes, val_seconds


@contextlib.contextmanager
def _blocks(sizes: dict[str, int]) -> Iterator[dict[str, shared_memory.SharedMemory]]:
    blocks: dict[str, shared_memory.SharedMemory] = {}
    try:
        for key, size in sizes.items():
            blocks[key] = shared_memory.SharedMemory(create=True, size=max(size, 1))
        yield blocks
    finally:
        for block in blocks.values():
            block.close()
            block.unlink()


@contextlib.contextmanager
def _processes(context: Any, target: Any, arguments: list[tuple[Any, ...]]) -> Iterator[Any]:
    """Start one process per argument tuple; the body calls ``stop(tell)`` to ask each to exit."""
    processes = [context.Process(target=target, args=args, daemon=True) for args in arguments]
    for process in processes:
        process.start()

    def stop(tell: Any) -> None:
        for index in range(len(processes)):
            tell(index)
        for process in processes:
            process.join(30)

    try:
        yield stop
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
