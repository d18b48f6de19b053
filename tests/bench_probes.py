"""A DDP rank that counts its dataset opens (tests/test_bench_fairness.py): the benchmark's own rank, run in a
spawned process with ``open_dataset`` wrapped so that each call appends a line to the file MEMTRAIN_TEST_OPENS."""

from __future__ import annotations

import os
from typing import Any

COUNT_FILE_ENV = "MEMTRAIN_TEST_OPENS"


def counting_rank(problem: Any, rank: int, port: int, report: Any) -> None:
    from memtrain.benchmarks import torch_peers

    real = torch_peers.open_dataset

    def counted(*args: Any, **kwargs: Any) -> Any:
        with open(os.environ[COUNT_FILE_ENV], "a", encoding="utf-8") as log:
            log.write(f"rank {rank}\n")
        return real(*args, **kwargs)

    torch_peers.open_dataset = counted
    torch_peers._rank(problem, rank, port, report)
