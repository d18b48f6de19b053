"""Model classes the Dask workers of tests/test_node_processes.py import by name (a module without test imports)."""

from __future__ import annotations

import multiprocessing

from memtrain.models.mlp import MLP


class UnsafeMLP(MLP):
    """The MLP, as a model that may not run in several threads at once (as a torch module): a node of P processes
    computes its range in P worker processes."""

    thread_safe = False


class NotInNodeProcesses(UnsafeMLP):
    """``UnsafeMLP`` that cannot be built in a node's worker process (a spawned ``memtrain-worker``): its
    processes never start."""

    def __init__(self, *args, **kwargs):
        if multiprocessing.current_process().name.startswith("memtrain-worker"):
            raise RuntimeError("this model is not built in a node's worker process")
        super().__init__(*args, **kwargs)


def slow_node_parts(seconds: float) -> None:
    """Run on a node's Dask worker (``Client.run``): each of its parts of a node record (memtrain/cluster/nodes.py's
    ``node_part``, looked up by the round's loop when it starts) takes ``seconds`` longer: waves of seconds."""
    import time

    from memtrain.cluster import nodes

    part = getattr(nodes.node_part, "unslowed", nodes.node_part)

    def slowed(*args, **kwargs):
        time.sleep(seconds)
        return part(*args, **kwargs)

    slowed.unslowed = part
    nodes.node_part = slowed


def wave_answer_raises(at: int) -> None:
    """Run on a node's Dask worker (``Client.run``): its ``at``-th answer to a wave (counting from 1) raises before
    the answer is written, once: the member's loop of the round ends with the error, unanswered, its worker lives
    on. (A part that raises is answered as the wave's error: ``broadcast.member_part``; this is the loop itself.)"""
    from memtrain.cluster import broadcast

    answer, calls = broadcast.WaveFiles.answer, [0]

    def raising(*args, **kwargs):
        calls[0] += 1
        if calls[0] == at:
            raise RuntimeError(f"answer {at} raised (a test)")
        return answer(*args, **kwargs)

    broadcast.WaveFiles.answer = raising
