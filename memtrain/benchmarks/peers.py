"""A benchmark problem -> per-update wall and compute times of the peers memtrain is measured against.

one process (no workers, BLAS on 1 thread or on every core); pickling the weights and the batch through
``multiprocessing.Queue`` every update; ``multiprocessing.shared_memory`` holding the weights, the data
and one gradient slot per worker, synchronised with small messages. All use ``problem.Model``.
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

from memtrain.benchmarks.problem import Model, Problem, timings


def one_process(problem: Problem, threads: int) -> dict[str, object]:
    """The whole batch in this process; BLAS on ``threads`` threads."""
    with threadpool_limits(limits=threads):
        model = Model(problem)
        weights, spare = model.initial(), np.empty(model.size, dtype=np.float32)
        grad = np.empty(model.size, dtype=np.float32)
        walls, computes = [], []
        for update, (lo, hi) in enumerate(problem.batches()):
            start = time.perf_counter()
            x, y = model.rows(lo, hi)
            _, compute = model.grad(weights, x, y, grad)
            model.step(update, weights, grad, hi - lo, spare)
            weights, spare = spare, weights
            walls.append(time.perf_counter() - start)
            computes.append(compute)
    return timings(walls, computes, threads=threads)


def _worker_pickle(problem: Problem, tasks: Any, results: Any) -> None:
    with threadpool_limits(limits=1):
        model = Model(problem)
        while (message := tasks.get()) is not None:
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
        walls, computes = [], []
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
        stop(lambda index: queues[index][0].put(None))
    return timings(walls, computes)


def _worker_shm(problem: Problem, names: dict[str, str], slot: int, conn: Any) -> None:
    with threadpool_limits(limits=1):
        model = Model(problem)
        rows, features = model.train.rows, model.context.spec.n_features
        blocks = {key: shared_memory.SharedMemory(name=name) for key, name in names.items()}
        weights = np.ndarray((2, model.size), np.float32, blocks["w"].buf)
        xs = np.ndarray((rows, features), np.float32, blocks["x"].buf)
        ys = np.ndarray((rows,), np.int64, blocks["y"].buf)
        grad = np.ndarray((problem.workers, model.size), np.float32, blocks["g"].buf)[slot]
        while (message := conn.recv()) is not None:
            parity, lo, hi = message
            conn.send(model.grad(weights[parity], xs[lo:hi], ys[lo:hi], grad))
        del weights, xs, ys, grad
        for block in blocks.values():
            block.close()


def shared_memory_peer(problem: Problem) -> dict[str, object]:
    """Weights (two buffers, alternating), data and per-worker gradient slots in shared memory.

    Messages are (weight buffer, lo, hi) out and (loss, seconds) back.
    """
    model = Model(problem)
    x_all, y_all = model.rows(0, model.train.rows)
    with _blocks({"w": 2 * model.size * 4, "x": x_all.nbytes, "y": y_all.nbytes,
                  "g": problem.workers * model.size * 4}) as blocks:
        weights = np.ndarray((2, model.size), np.float32, blocks["w"].buf)
        weights[0] = model.initial()
        np.ndarray(x_all.shape, np.float32, blocks["x"].buf)[:] = x_all
        np.ndarray(y_all.shape, np.int64, blocks["y"].buf)[:] = y_all
        grads = np.ndarray((problem.workers, model.size), np.float32, blocks["g"].buf)
        names = {key: block.name for key, block in blocks.items()}
        context = multiprocessing.get_context("spawn")
        pipes = [context.Pipe() for _ in range(problem.workers)]
        with _processes(context, _worker_shm, [(problem, names, k, pipes[k][1]) for k in range(problem.workers)]) \
                as stop:
            walls, computes = _shm_loop(problem, model, weights, grads, [p[0] for p in pipes])
            stop(lambda index: pipes[index][0].send(None))
        del weights, grads
    return timings(walls, computes)


def _shm_loop(problem: Problem, model: Model, weights: np.ndarray, grads: np.ndarray,
              conns: list[Any]) -> tuple[list[float], list[float]]:
    total = np.empty(model.size, dtype=np.float32)
    walls, computes = [], []
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
    return walls, computes


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
