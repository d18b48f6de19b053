"""The two-level round's chain (memtrain/train/loops/node_sum.py) across simulated nodes (tests/netns_nodes.py: each
node its own network, mount and hostname namespaces, its own /dev/shm): every node's processes compute their tasks'
gradients into the node's own /dev/shm, meet, share the node's segments of the fold, and publish its partial in the
shared folder; all nodes started at once, each waiting for its predecessor's segments. The last partial is the
in-order fold of every gradient, bit for bit, for 1, 2 and 3 nodes of unequal process counts; no node sees another's
scratch; each node writes exactly one partial (its segments). Skipped, saying why, where namespaces cannot be made."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from chain_node import gradient
from netns_nodes import Nodes, unavailable

from memtrain.train.exchange.weights import BLOCK
from memtrain.train.loops.node_sum import PartialSum, node_tasks, read_sum

pytestmark = pytest.mark.timeout(240)
REPO = Path(__file__).resolve().parent.parent
SEED, SIZE, SEGMENT_BLOCKS = 17, 3 * BLOCK + 123, 1


@pytest.fixture
def nodes(tmp_path: Path):
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    made = Nodes(tmp_path)
    try:
        yield made
    finally:
        made.close()


@pytest.mark.parametrize("processes", [[3], [1, 2], [2, 1, 3]], ids=lambda p: "x".join(map(str, p)))
def test_the_chain_across_nodes_gives_the_in_order_fold(nodes: Nodes, tmp_path: Path, processes: list[int]) -> None:
    shared, token = tmp_path / "shared", uuid.uuid4().hex[:8]
    shared.mkdir()
    tasks = sum(processes) + 2  # some process of a node computes two tasks
    started = []
    for j in range(len(processes)):
        nodes.add(f"node{j}")
    for j in range(len(processes)):  # every node at once: each waits for its predecessor's segments
        started.append(nodes.start(
            f"node{j}", [sys.executable, str(REPO / "tests" / "chain_node.py"), str(shared), token, str(SEED),
                         str(tasks), str(SIZE), str(SEGMENT_BLOCKS), ",".join(map(str, processes)), str(j)],
            tmp_path / f"node{j}.log", env={"PYTHONPATH": str(REPO)}))
    for j, process in enumerate(started):
        try:
            code = process.wait(120)
        except subprocess.TimeoutExpired:
            code = None
        assert code == 0, (tmp_path / f"node{j}.log").read_text()[-3000:]

    grads = [gradient(SEED, t, SIZE) for t in range(tasks)]
    local = functools.reduce(lambda a, b: np.add(a, b, dtype=np.float32), grads[1:], grads[0].copy())
    chain = PartialSum(shared, update=5, attempt=0, version=4, size=SIZE, segment_blocks=SEGMENT_BLOCKS)
    assert read_sum(chain, tasks, deadline=time.monotonic() + 5).tobytes() == local.tobytes()

    ranges = node_tasks(tasks, processes)
    segments = len(chain.segments())
    partials = sorted(name for name in os.listdir(shared) if name.startswith("c-"))
    assert partials == sorted(chain.path(hi, s).name for _, hi in ranges for s in range(segments))  # one per node
    for j, (lo, hi) in enumerate(ranges):
        report = json.loads((shared / f"node-{j}.json").read_text())
        assert report["host"] == f"node{j}" and report["exit"] == [0] * processes[j]
        assert report["scratch"] == sorted(f"g{t}.npy" for t in range(lo, hi))  # its own tasks, node-local
        assert report["others_seen"] == []  # no node sees another's /dev/shm
    assert not [name for name in os.listdir("/dev/shm") if name.startswith(f"mtchain-{token}")]
