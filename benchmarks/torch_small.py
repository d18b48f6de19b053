"""A small torch module: ``memtrain train`` (workers 0, "auto", 2) against a plain torch loop, whole processes.

    python -m benchmarks.torch_small --repeats 3
    python -m benchmarks.torch_small --loop           # (internal) the plain loop itself, one process

Issue 43's small-module target: a table of 27 features (a synthetic stand-in for the movies table: 10 classes,
``--rows`` training rows, 1,024 validation rows, memtrain/benchmarks/synthetic.py), the module Linear(27, 64) +
ReLU + Linear(64, 10) (``benchmark_mlp``, 2,442 parameters), batch ``--batch``, Adam at lr 0.003, E = 3 and
2E = 6 epochs. The plain loop is docs/python-api.md's: ``ds.batches(batch, seed=0, epoch=e)`` (the default row
order) and ``ds.normalizer``, ``torch.set_num_threads(1)``, a validation pass after every epoch (as memtrain's
job does). memtrain's job: everything at its default but the model, the batch, ``train.tasks_per_update = 2``,
the optimizer and the epochs. Every run is a whole process (``subprocess``), timed by wall clock; the methods
run interleaved, ``--repeats`` times; printed: the E runs' wall and the start-up-cancelled cost per update
((2E - E) / E's updates), medians (min-max), with the ratio plain loop ÷ method per repeat (≥ 1: memtrain faster).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.torch_outside import spread, timed
from memtrain.benchmarks.synthetic import write_dataset

FEATURES, HIDDEN = 27, 64
FACTORY = "memtrain.benchmarks.torch_peers:benchmark_mlp"


def loop(dataset: str, epochs: int, batch: int) -> None:
    """The plain torch loop of docs/python-api.md over the same batches, with a validation pass per epoch."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    import memtrain
    from memtrain.benchmarks.torch_peers import benchmark_mlp
    from memtrain.train.context import data_spec

    torch.set_num_threads(1)
    ds = memtrain.open_dataset(dataset)
    norm = ds.normalizer
    torch.manual_seed(0)
    net = benchmark_mlp(data_spec(ds.manifest), HIDDEN)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.003)
    vx, vy = ds.split("val")[:]
    vx, vy = torch.from_numpy(norm(vx)), torch.tensor(vy)
    for epoch in range(epochs):
        for x, y in ds.batches(batch, seed=0, epoch=epoch):
            x, y = torch.from_numpy(norm(x)), torch.tensor(y)
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            net.eval()
            val = float(F.cross_entropy(net(vx), vy))
            net.train()
    assert np.isfinite(val)


def job_text(dataset: Path, batch: int, run_dir: Path) -> str:
    return (f'[data]\npath = "{dataset}"\n\n[model]\nkind = "torch"\nfactory = "{FACTORY}"\nhidden = {HIDDEN}\n\n'
            f'[train]\nbatch_size = {batch}\ntasks_per_update = 2\noptimizer = "adam"\nlr = 0.003\nseed = 0\n\n'
            f'[run]\ndir = "{run_dir}"\n')


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--rows", type=int, default=40_000)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--workers", default="0,auto,2", help="memtrain's train.workers, one method each")
    parser.add_argument("--scratch", default=os.environ.get("MEMTRAIN_BENCH_SCRATCH", tempfile.gettempdir()))
    parser.add_argument("--loop", nargs=3, metavar=("DATASET", "EPOCHS", "BATCH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop:
        return loop(args.loop[0], int(args.loop[1]), int(args.loop[2]))
    scratch = Path(args.scratch) / "torch-small"
    scratch.mkdir(parents=True, exist_ok=True)
    dataset = write_dataset(scratch / f"data-{args.rows}", args.rows, 1024, features=FEATURES)
    job = scratch / "job.toml"
    job.write_text(job_text(dataset, args.batch, scratch / "run"))
    updates = -(-args.rows // args.batch)
    methods = ["loop"] + [f"workers={w}" for w in args.workers.split(",")]
    e = args.epochs
    times: dict[str, dict[int, list[float]]] = {m: {e: [], 2 * e: []} for m in methods}
    cpus: dict[str, dict[int, list[float]]] = {m: {e: [], 2 * e: []} for m in methods}
    print(f"load average before: {os.getloadavg()}", flush=True)
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for method in methods:
            for epochs in (e, 2 * e):
                if method == "loop":
                    command = [sys.executable, "-m", "benchmarks.torch_small", "--loop", str(dataset), str(epochs),
                               str(args.batch)]
                else:
                    workers = method.split("=")[1]
                    value = f'"{workers}"' if workers == "auto" else workers
                    command = ["memtrain", "train", str(job), "-q", "--overwrite", "--set", f"train.epochs={epochs}",
                               "--set", f"train.workers={value}", "--run-dir", str(scratch / "run")]
                times[method][epochs].append(timed(command, cpus[method][epochs]))
        print(f"  repeat {repeat + 1}: load {os.getloadavg()[0]:.1f}; " + ", ".join(
            f"{m} {times[m][e][-1]:.2f}/{times[m][2 * e][-1]:.2f} s" for m in methods), flush=True)
    per_update = {m: [(b - a) / (e * updates) * 1e3 for a, b in zip(times[m][e], times[m][2 * e], strict=True)]
                  for m in methods}
    print(f"\n{args.rows:,} rows x {FEATURES} features, batch {args.batch} ({updates} updates an epoch), "
          f"E = {e} and 2E = {2 * e} epochs, {args.repeats} interleaved repeats, "
          f"{time.perf_counter() - started:.0f} s; "
          "median (min-max)")
    print("| method | E run s (whole) | ms/update (start-up cancelled) | loop ÷ method, whole | loop ÷ method, "
          "per update | E run CPU s | CPU ms/update |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for m in methods:
        whole = [a / b for a, b in zip(times["loop"][e], times[m][e], strict=True)]
        cancelled = [a / b for a, b in zip(per_update["loop"], per_update[m], strict=True)]
        cpu_update = [(b - a) / (e * updates) * 1e3 for a, b in zip(cpus[m][e], cpus[m][2 * e], strict=True)]
        print(f"| {m} | {spread(times[m][e])} | {spread(per_update[m])} | {spread(whole)} | {spread(cancelled)} | "
              f"{spread(cpus[m][e])} | {spread(cpu_update)} |")
    print(f"\nload average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
