"""Model classes the Dask workers of tests/test_node_processes.py import by name (a module without test imports)."""

from __future__ import annotations

from memtrain.models.mlp import MLP


class UnsafeMLP(MLP):
    """The MLP, as a model that may not run in several threads at once (as a torch module): a node of P processes
    computes its range in P worker processes."""

    thread_safe = False
