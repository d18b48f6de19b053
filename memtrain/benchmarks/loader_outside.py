"""The loader measured as an outside harness would: one process per run, the whole epoch timed by the wall
clock (iterator made inside the clock), rows order, no loader workers, a consumer touching every byte.

    python -m memtrain.benchmarks.loader_outside DIR --rows 1000000 --repeats 5

DIR gets a memtrain dataset and one x.npy/y.npy pair of the same rows (made once, reused). Methods, run
interleaved, each in a fresh process: ``batches`` (``ds.batches``), ``torch`` (``BatchDataset`` under a
``DataLoader``, 0 workers), ``memmap`` (``np.memmap`` + ``DataLoader``, ``BatchSampler(RandomSampler)``,
each batch's rows sorted and gathered with one fancy index per array) and ``take`` (plain numpy: the same
epoch's rows sorted per batch, one ``np.take`` per array into a fresh array). ``--consumer torch`` sums
with torch (its threads) instead of numpy.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

METHODS = ("batches", "torch", "memmap", "take")


def prepare(root: Path, rows: int) -> None:
    """The dataset and the x.npy/y.npy pair, once; then every file read into the page cache."""
    from memtrain.benchmarks.loader_bench import write_sources

    if not (root / "x.npy").exists():
        write_sources(root, rows, 64, ["memtrain_batches", "memmap_dataloader"])
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as handle:
                while handle.read(16 << 20):
                    pass


def epoch(method: str, root: Path, batch: int, consumer: str) -> dict[str, float]:
    """One epoch of ``method``, timed from before its iterator is made to after the last batch is consumed
    (modules imported before the clock starts: a program imports them once, not per epoch)."""
    import torch
    import torch.utils.data  # noqa: F401

    import memtrain.dataset
    import memtrain.torch  # noqa: F401

    if consumer == "torch":
        def touch(x, y):  # noqa: ANN001, ANN202
            return float(torch.as_tensor(x).sum()) + float(torch.as_tensor(y).sum())
    else:
        def touch(x, y):  # noqa: ANN001, ANN202
            return float(np.asarray(x).sum()) + float(np.asarray(y).sum())
    started, cpu = time.perf_counter(), time.process_time()
    total = 0
    for x, y in _iterate(method, root, batch):
        touch(x, y)
        total += np.asarray(x).nbytes + np.asarray(y).nbytes
    wall = time.perf_counter() - started
    return {"bytes": total, "wall": wall, "cpu": time.process_time() - cpu}


def _iterate(method: str, root: Path, batch: int):  # noqa: ANN202
    from memtrain.dataset import open_dataset

    if method == "batches":
        return open_dataset(root / "memtrain").batches(batch, seed=0, epoch=1)
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    if method == "torch":
        from memtrain.torch import BatchDataset

        return DataLoader(BatchDataset(open_dataset(root / "memtrain"), batch, seed=0, epoch=1), batch_size=None)
    x, y = (np.load(root / name, mmap_mode="r") for name in ("x.npy", "y.npy"))
    if method == "memmap":
        from memtrain.benchmarks.loader_bench import MemmapRows

        data = MemmapRows(str(root / "x.npy"), str(root / "y.npy"))
        return DataLoader(data, batch_size=None, sampler=BatchSampler(RandomSampler(data), batch, drop_last=False))
    order = np.random.default_rng(1).permutation(len(x))
    return ((np.take(x, rows, axis=0), np.take(y, rows, axis=0))
            for rows in (np.sort(order[i:i + batch]) for i in range(0, len(x), batch)))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("root", type=Path)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--consumer", choices=("numpy", "torch"), default="numpy")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(epoch(args.one, args.root, args.batch, args.consumer)))
        return 0
    prepare(args.root, args.rows)
    methods = args.methods.split(",")
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in methods}
    print(f"load average before: {os.getloadavg()}")
    for _ in range(args.repeats):
        for method in methods:
            out = subprocess.run([sys.executable, "-m", "memtrain.benchmarks.loader_outside", str(args.root),
                                  "--one", method, "--batch", str(args.batch),
                                  "--consumer", args.consumer], check=True, capture_output=True, text=True)
            runs[method].append(json.loads(out.stdout))
    print(f"load average after: {os.getloadavg()}")
    base = [r["bytes"] / r["wall"] for r in runs.get("memmap", [])]
    for method, results in runs.items():
        rates = [r["bytes"] / r["wall"] / 1e9 for r in results]
        cpu = [r["bytes"] / r["cpu"] / 1e9 for r in results]
        line = (f"{method:8} wall {statistics.median(rates):.2f} GB/s ({min(rates):.2f}-{max(rates):.2f})"
                f"  by CPU {statistics.median(cpu):.2f} ({min(cpu):.2f}-{max(cpu):.2f})")
        if base:
            ratios = [r * 1e9 / b for r, b in zip(rates, base, strict=True)]
            line += f"  vs memmap {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
