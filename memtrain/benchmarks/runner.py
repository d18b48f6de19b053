"""One method on one problem, in a fresh process: ``python -m memtrain.benchmarks.runner SPEC_JSON`` -> JSON.

Each method runs in its own process so that its memory peak, its BLAS threads and its imports are its
own; the harness samples the memory of this process and its workers from outside.
"""

from __future__ import annotations

import json
import os
import resource
import sys
from pathlib import Path
from typing import Any

from memtrain.benchmarks.problem import Problem
from memtrain.train.optim import OptimizerConfig
from memtrain.train.worker.launch import end_command

METHODS = ("memtrain", "one_process", "pickle_queue", "shared_memory", "one_process_blas")
# The same comparison for a torch.nn.Module (benchmarks/torch_peers.py): memtrain with kind = "torch",
# torch DDP on gloo, one torch process on every core. Ratios are taken against torch_memtrain.
TORCH_METHODS = ("torch_memtrain", "torch_ddp", "torch_all_cores")
# memtrain with its placement forced (train.workers = 0 or = the problem's workers): not run by default
FORCED = ("memtrain_server", "memtrain_workers")
# the README's first command (memtrain/benchmarks/first_job.py)
FIRST_JOB = ("first_memtrain", "first_loop")
CLUSTER_METHOD = "memtrain_cluster"  # memtrain with its workers on Dask (``bench train --cluster ADDRESS``)


def run_method(method: str, problem: Problem, scratch: Path, exchange: str = "auto",
               cluster: str = "") -> dict[str, Any]:
    from memtrain.benchmarks import first_job, peers
    from memtrain.benchmarks.memtrain_run import run_memtrain

    if method == "memtrain":
        return run_memtrain(problem, scratch, exchange, workers="auto")
    if method == CLUSTER_METHOD:
        return run_memtrain(problem, scratch, exchange, workers=problem.workers, cluster=cluster)
    if method == "memtrain_server":
        return run_memtrain(problem, scratch, exchange, workers=0)
    if method == "memtrain_workers":
        return run_memtrain(problem, scratch, exchange, workers=problem.workers)
    if method == "first_memtrain":
        return first_job.run_memtrain(Path(problem.dataset), scratch, problem.epochs)
    if method == "first_loop":
        return first_job.run_loop(Path(problem.dataset), problem.epochs)
    if method in TORCH_METHODS:
        return run_torch_method(method, problem, scratch, exchange)
    if method == "one_process":
        return peers.one_process(problem, threads=1)
    if method == "one_process_blas":
        return peers.one_process(problem, threads=os.cpu_count() or 1)
    if method == "pickle_queue":
        return peers.pickle_queue(problem)
    if method == "shared_memory":
        return peers.shared_memory_peer(problem)
    raise ValueError(f"unknown method {method!r}")


def run_torch_method(method: str, problem: Problem, scratch: Path, exchange: str) -> dict[str, Any]:
    from memtrain.benchmarks import torch_peers
    from memtrain.benchmarks.memtrain_run import run_memtrain
    from memtrain.config import ModelConfig

    if method == "torch_memtrain":
        model = ModelConfig("torch", {"factory": torch_peers.FACTORY, "hidden": problem.hidden})
        return run_memtrain(problem, scratch, exchange, workers="auto", model=model)
    if method == "torch_ddp":
        return torch_peers.ddp(problem)
    return torch_peers.all_cores(problem)


def spec_to_problem(spec: dict[str, Any]) -> Problem:
    fields = dict(spec["problem"])
    fields["optimizer"] = OptimizerConfig(**fields["optimizer"])
    return Problem(**fields)


def main(argv: list[str]) -> int:
    spec = json.loads(argv[1])
    limit = spec.get("data_limit_bytes")
    if limit:  # private (anonymous) memory only: file maps are MAP_SHARED and not counted
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    result = run_method(spec["method"], spec_to_problem(spec), Path(spec["scratch"]), spec.get("exchange", "auto"),
                        spec.get("cluster", ""))
    result["self_maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(result), flush=True)
    return 0


def is_memtrain(method: str) -> bool:
    """A row of memtrain itself (any placement, order or checkout), not a peer's."""
    return method.startswith(("memtrain", "torch_memtrain"))


def ends_as_the_command(method: str) -> bool:
    """memtrain's runs end as the ``memtrain`` command does, without the interpreter's teardown when nothing
    else runs (train/worker/launch.py ``end_command``); a peer ends as the user's script would, with it."""
    return is_memtrain(method) or method == "first_memtrain"


if __name__ == "__main__":
    code = main(sys.argv)
    if ends_as_the_command(json.loads(sys.argv[1])["method"]):
        end_command(code)
    sys.exit(code)
