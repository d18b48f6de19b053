"""One simulated node's part of a two-level round's chain (run by tests/test_node_sum_nodes.py inside a node's
namespaces): its processes compute their tasks' gradients into the node's own /dev/shm (node-local scratch,
invisible to the other nodes), meet, then share the node's segments of the fold (memtrain/train/loops/node_sum.py)
into the shared folder. Writes ``node-J.json`` into the shared folder: what it saw.

Usage: python chain_node.py SHARED TOKEN SEED TASKS SIZE SEGMENT_BLOCKS PROCESSES(comma-separated) NODE
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import socket
import sys
import time
from pathlib import Path

import numpy as np

from memtrain.train.loops.node_sum import PartialSum, fold_node, node_tasks


def gradient(seed: int, task: int, size: int) -> np.ndarray:
    """Task ``task``'s gradient: float32 of widely spread magnitudes (tests/test_node_sum_nodes.py makes the same)."""
    rng = np.random.default_rng([seed, task])
    return (rng.normal(size=size) * 10.0 ** rng.integers(-4, 5, size=size)).astype(np.float32)


def member(rank: int, count: int, chain: PartialSum, lo: int, hi: int, scratch: Path, seed: int,
           barrier: mp.Barrier) -> None:
    for task in range(lo + rank, hi, count):  # this process's tasks of the node's range
        np.save(scratch / f"g{task}.npy", gradient(seed, task, chain.size))
    barrier.wait(60)  # the node's processes meet: every gradient of the node written
    grads = {t: np.load(scratch / f"g{t}.npy", mmap_mode="r") for t in range(lo, hi)}
    fold_node(chain, lo, hi, grads.__getitem__, deadline=time.monotonic() + 60, share=(rank, count))


def main() -> int:
    shared, token, seed, tasks, size, blocks, processes, node = sys.argv[1:]
    shared, node = Path(shared), int(node)
    counts = [int(p) for p in processes.split(",")]
    lo, hi = node_tasks(int(tasks), counts)[node]
    chain = PartialSum(shared, update=5, attempt=0, version=4, size=int(size), segment_blocks=int(blocks))
    scratch = Path("/dev/shm") / f"mtchain-{token}-node{node}"
    scratch.mkdir()
    barrier = mp.get_context("fork").Barrier(counts[node])
    procs = [mp.get_context("fork").Process(target=member, args=(i, counts[node], chain, lo, hi, scratch, int(seed),
                                                                 barrier)) for i in range(counts[node])]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
    # the nodes before this one made their scratch before publishing what this one read: seen here only if shared
    others = [k for k in range(len(counts)) if k != node and (Path("/dev/shm") / f"mtchain-{token}-node{k}").exists()]
    report = {"host": socket.gethostname(), "range": [lo, hi], "exit": [p.exitcode for p in procs],
              "scratch": sorted(os.listdir(scratch)), "others_seen": others}
    (shared / f"node-{node}.json").write_text(json.dumps(report))
    return 0 if all(p.exitcode == 0 for p in procs) else 1


if __name__ == "__main__":
    raise SystemExit(main())
