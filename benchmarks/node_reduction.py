"""The two-level round's reduction across nodes (issue 42): three designs that give the same bits for any node layout.

Run: ``python -m benchmarks.node_reduction [--sizes 1e6,1e7] [--nodes 1,2,4,8] [--processes 1,2,4] [--repeats 3]``.

Each simulated node is a group of processes (one task each, ``nodes x processes`` tasks per update), its tasks'
gradients already written in its own folder of /dev/shm (node-local, as a node's processes leave them); the
shared filesystem is a folder of ``--dir`` (default: $TMPDIR). Timed per update, from a barrier that every
process passes to the last one finishing, the reduction alone (no compute, no step):

- **chain** (memtrain/train/loops/node_sum.py, what memtrain builds): node j continues the in-order fold from
  node j - 1's partial, segment by segment (each node's processes share its segments), and publishes its partial;
  the last partial is today's sum, bit for bit.
- **tree**: a binary sum tree over the task indices fixed by the plan (split at the midpoint): each node publishes
  the largest subtrees inside its range, node 0's processes add the rest of the tree. Reproducible for any layout,
  but not today's bits.
- **binned**: an order-independent exact-to-the-window sum in numpy (ReproBLAS-like: per element 3 integer limbs
  of 32 bits on a fixed grid of exponents, the window set by the largest magnitude): each node publishes its
  binned partial, node 0's processes merge them and round once. Reproducible, but not today's bits.

Printed per (size, layout, design): the median wall time per update with its range (least-most), the median CPU
of all processes per update, and the most bytes any node moved over the shared folder per update, in vectors
(written, and read from other nodes; the version's read, one vector for every design, not included).
Every file is in the page cache: the file terms of a real network filesystem come on top (docs/cluster.md's
model). The machine is shared: the three designs are interleaved in every repeat, in rotating order.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from memtrain.train.loops.node_sum import PartialSum, fold_node, node_tasks, segment_ranges

DESIGNS = ("chain", "tree", "binned")
LIMBS, WIDTH = 3, 32  # the binned sum's window: 3 limbs of 32 bits (float32 values span at most 2 limbs)
DEADLINE = 600.0


# --- the fixed tree ---

def tree_edges(lo: int, hi: int) -> list[tuple[int, int]]:
    """Every subtree of the plan's fixed tree over tasks [lo, hi) (split at the midpoint), root first."""
    if hi - lo <= 1:
        return [(lo, hi)]
    mid = (lo + hi) // 2
    return [(lo, hi), *tree_edges(lo, mid), *tree_edges(mid, hi)]


def tree_sum(grads: list[np.ndarray], lo: int = 0, hi: int | None = None) -> np.ndarray:
    """The fixed tree's sum of ``grads[lo:hi]`` (a new array)."""
    hi = len(grads) if hi is None else hi
    if hi - lo == 1:
        return grads[lo].copy()
    mid = (lo + hi) // 2
    return np.add(tree_sum(grads, lo, mid), tree_sum(grads, mid, hi))


def maximal_subtrees(tasks: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """The largest subtrees of the tree over [0, tasks) that lie inside [lo, hi): what a node of that range sends."""
    out: list[tuple[int, int]] = []

    def visit(a: int, b: int) -> None:
        if b <= lo or a >= hi:
            return
        if lo <= a and b <= hi:
            out.append((a, b))
            return
        mid = (a + b) // 2
        visit(a, mid)
        visit(mid, b)

    if tasks:
        visit(0, tasks)
    return out


def tree_from(parts: dict[tuple[int, int], np.ndarray], a: int, b: int) -> np.ndarray:
    """The tree's sum over [a, b) from the subtree sums ``parts`` (which tile it)."""
    if (a, b) in parts:
        return parts[(a, b)]
    mid = (a + b) // 2
    return np.add(tree_from(parts, a, mid), tree_from(parts, mid, b))


# --- the binned sum ---

def binned_zero(n: int) -> tuple[np.ndarray, np.ndarray]:
    """An empty binned accumulator of ``n`` elements: the top bin (-1: none yet) and LIMBS limbs, top first."""
    return np.full(n, -1, dtype=np.int64), np.zeros((LIMBS, n), dtype=np.int64)


def shift_window(top: np.ndarray, limbs: np.ndarray, new_top: np.ndarray) -> None:
    """Move each element's window up to ``new_top``: limbs that fall below it are dropped, on the fixed grid."""
    d = new_top - top
    if not d.any():
        return
    old = limbs.copy()
    for k in range(LIMBS):
        limbs[k] = 0
        for j in range(k + 1):  # limb k now holds bin new_top - k = old limb k - d
            np.copyto(limbs[k], old[j], where=d == k - j)
    np.copyto(top, new_top)


def binned_add(top: np.ndarray, limbs: np.ndarray, values: np.ndarray) -> None:
    """Deposit float32 ``values`` exactly on the grid: value = m * 2^q (q >= 0 after an offset of 149), its two
    32-bit pieces into bins q // 32 and q // 32 + 1; whatever falls below the window is dropped, as ReproBLAS's
    fixed bins do. Integer additions: the result does not depend on the order of deposits."""
    bits = values.view(np.int32).astype(np.int64)
    exponent = (bits >> 23) & 0xFF
    mantissa = np.where(exponent > 0, (bits & 0x7FFFFF) | 0x800000, bits & 0x7FFFFF)
    q = np.maximum(exponent, 1) - 1
    wide = mantissa << (q & (WIDTH - 1))
    low, high = wide & 0xFFFFFFFF, wide >> WIDTH
    negative = bits < 0
    np.negative(low, out=low, where=negative)
    np.negative(high, out=high, where=negative)
    value_top = np.where(mantissa > 0, (q >> 5) + 1, -1)
    shift_window(top, limbs, np.maximum(top, value_top))
    at = top - value_top  # the limb of the high piece; the low piece one below
    for k in range(LIMBS):
        limbs[k] += np.where(at == k, high, 0)
        limbs[k] += np.where(at + 1 == k, low, 0)


def binned_merge(top: np.ndarray, limbs: np.ndarray, other_top: np.ndarray, other_limbs: np.ndarray) -> None:
    """Add another binned accumulator into this one (exact, order-independent)."""
    new_top = np.maximum(top, other_top)
    shift_window(top, limbs, new_top)
    other_top, other_limbs = other_top.copy(), other_limbs.copy()
    shift_window(other_top, other_limbs, new_top)
    limbs += other_limbs


def binned_round(top: np.ndarray, limbs: np.ndarray) -> np.ndarray:
    """The accumulator as float32 (via float64: deterministic, rounded twice)."""
    total = np.zeros(top.size, dtype=np.float64)
    for k in range(LIMBS - 1, -1, -1):
        total += np.ldexp(limbs[k].astype(np.float64), (WIDTH * (top - k) - 149).astype(np.int32))
    return total.astype(np.float32)


def binned_sum(grads: list[np.ndarray]) -> np.ndarray:
    top, limbs = binned_zero(grads[0].size)
    for grad in grads:
        binned_add(top, limbs, grad)
    return binned_round(top, limbs)


# --- the simulated nodes ---

def publish(path: Path, array: np.ndarray) -> int:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    np.save(tmp, array)
    os.rename(f"{tmp}.npy", path)
    return array.nbytes


def wait_load(path: Path, deadline: float) -> np.ndarray:
    pause = 0.0002
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(path)
        time.sleep(pause)
        pause = min(2 * pause, 0.005)
    return np.load(path)


class Member:
    """Process ``rank`` of node ``node``: its node's gradients mapped, its share of the node's segments."""

    def __init__(self, shared: Path, local: list[Path], size: int, nodes: int, processes: int, node: int, rank: int):
        self.shared, self.size, self.nodes, self.processes = shared, size, nodes, processes
        self.node, self.rank, self.tasks = node, rank, nodes * processes
        self.lo, self.hi = node_tasks(self.tasks, [processes] * nodes)[node]
        self.grads = {t: np.load(local[t], mmap_mode="r") for t in range(self.lo, self.hi)}
        self.segments = segment_ranges(size)
        self.mine = range(rank, len(self.segments), processes)

    def run(self, design: str, update: int) -> int:
        """One update's reduction; returns the bytes this process moved over the shared folder."""
        return getattr(self, design)(update, time.monotonic() + DEADLINE)

    def chain(self, update: int, deadline: float) -> int:
        chain = PartialSum(self.shared, update=update, attempt=0, version=update, size=self.size)
        paths = fold_node(chain, self.lo, self.hi, self.grads.__getitem__, deadline=deadline,
                          share=(self.rank, self.processes))
        read = sum(os.path.getsize(chain.path(self.lo, s)) for s in self.mine) if self.lo else 0
        return read + sum(os.path.getsize(p) for p in paths)

    def tree(self, update: int, deadline: float) -> int:
        moved = 0
        subtrees = maximal_subtrees(self.tasks, self.lo, self.hi)
        grads = [self.grads.get(t) for t in range(self.tasks)]
        for s in self.mine:
            a, b = self.segments[s]
            part = [None if g is None else g[a:b] for g in grads]
            for lo, hi in subtrees:
                moved += publish(self.shared / f"t-u{update}-{lo}-{hi}-s{s}.npy", tree_sum(part, lo, hi))
        if self.node == 0:
            every = [sub for j in range(self.nodes) for sub in maximal_subtrees(
                self.tasks, *node_tasks(self.tasks, [self.processes] * self.nodes)[j])]
            for s in self.mine:
                parts = {sub: wait_load(self.shared / f"t-u{update}-{sub[0]}-{sub[1]}-s{s}.npy", deadline)
                         for sub in every}
                moved += sum(p.nbytes for sub, p in parts.items() if sub not in subtrees)  # others' only
                moved += publish(self.shared / f"t-u{update}-sum-s{s}.npy", tree_from(parts, 0, self.tasks))
        return moved

    def binned(self, update: int, deadline: float) -> int:
        moved = 0
        for s in self.mine:
            a, b = self.segments[s]
            top, limbs = binned_zero(b - a)
            for t in range(self.lo, self.hi):
                binned_add(top, limbs, np.ascontiguousarray(self.grads[t][a:b]))
            moved += publish(self.shared / f"b-u{update}-n{self.node}-s{s}.npy", np.vstack([top, limbs]))
        if self.node == 0:
            for s in self.mine:
                a, b = self.segments[s]
                top, limbs = binned_zero(b - a)
                for j in range(self.nodes):
                    other = wait_load(self.shared / f"b-u{update}-n{j}-s{s}.npy", deadline)
                    moved += other.nbytes if j else 0  # its own node's partial it had in memory
                    binned_merge(top, limbs, other[0], other[1:])
                moved += publish(self.shared / f"b-u{update}-sum-s{s}.npy", binned_round(top, limbs))
        return moved


def member_loop(args: tuple, commands: mp.Queue, answers: mp.Queue, barrier: mp.Barrier) -> None:
    member = Member(*args)
    while (command := commands.get()) is not None:
        design, update = command
        barrier.wait()
        start, cpu = time.monotonic(), time.process_time()
        moved = member.run(design, update)
        answers.put((member.node, start, time.monotonic(), time.process_time() - cpu, moved))


def measure(shared: Path, local: list[Path], size: int, nodes: int, processes: int, repeats: int,
            update: int) -> dict[str, list[tuple[float, float, float]]]:
    """(wall, cpu, most bytes per node) per repeat, per design, the designs interleaved in rotating order."""
    count = nodes * processes
    barrier = mp.Barrier(count)
    commands = [mp.Queue() for _ in range(count)]
    answers: mp.Queue = mp.Queue()
    members = [mp.Process(target=member_loop, args=((shared, local, size, nodes, processes, j, i),
                                                    commands[j * processes + i], answers, barrier))
               for j in range(nodes) for i in range(processes)]
    for member in members:
        member.start()
    out: dict[str, list[tuple[float, float, float]]] = {design: [] for design in DESIGNS}
    try:
        for repeat in range(repeats):
            for design in DESIGNS[repeat % 3:] + DESIGNS[:repeat % 3]:
                update += 1
                for queue in commands:
                    queue.put((design, update))
                got = [answers.get(timeout=DEADLINE) for _ in range(count)]
                per_node = [sum(g[4] for g in got if g[0] == j) for j in range(nodes)]
                out[design].append((max(g[2] for g in got) - min(g[1] for g in got), sum(g[3] for g in got),
                                    max(per_node) / (4 * size)))
                for name in os.listdir(shared):
                    os.unlink(shared / name)
    finally:
        for queue in commands:
            queue.put(None)
        for member in members:
            member.join()
    return out


def spread(values: list[float], scale: float, digits: int) -> str:
    return (f"{statistics.median(values) * scale:.{digits}f} ({min(values) * scale:.{digits}f}-"
            f"{max(values) * scale:.{digits}f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e6,1e7")
    parser.add_argument("--nodes", default="1,2,4,8")
    parser.add_argument("--processes", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="the shared folder's parent (default: $TMPDIR)")
    args = parser.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    node_counts = [int(n) for n in args.nodes.split(",")]
    process_counts = [int(p) for p in args.processes.split(",")]
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.repeats} repeats per cell")
    print("| parameters | nodes x processes | design | wall ms per update, median (range) | CPU ms per update, "
          "median (range) | most shared-folder bytes per node, vectors |")
    print("|---|---|---|---|---|---|")
    update = 0
    for size in sizes:
        rng = np.random.default_rng(0)
        most = max(node_counts) * max(process_counts)
        with tempfile.TemporaryDirectory(dir="/dev/shm") as local_dir, \
                tempfile.TemporaryDirectory(dir=args.dir) as shared_dir:
            local = []
            for t in range(most):
                path = Path(local_dir) / f"g{t}.npy"
                np.save(path, (rng.normal(size=size) * 10.0 ** rng.integers(-3, 4, size=size)).astype(np.float32))
                local.append(path)
            for nodes in node_counts:
                for processes in process_counts:
                    shared = Path(shared_dir) / f"{nodes}x{processes}"
                    shared.mkdir()
                    results = measure(shared, local, size, nodes, processes, args.repeats, update)
                    update += 3 * args.repeats
                    for design in DESIGNS:
                        walls, cpus, moved = zip(*results[design], strict=True)
                        print(f"| {size:.0e} | {nodes} x {processes} | {design} | {spread(list(walls), 1e3, 1)} | "
                              f"{spread(list(cpus), 1e3, 1)} | {max(moved):.2f} |", flush=True)
                    shutil.rmtree(shared)
    print(f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
