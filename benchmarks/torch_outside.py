"""memtrain's torch module against a plain DDP script, timed from outside: whole processes, E and 2E epochs.

    python -m benchmarks.torch_outside --sizes 1e6,1e7 --repeats 3
    python -m benchmarks.torch_outside --sizes 1e6 --variant 'batches=train.shuffle="batches"'

What a user's own harness does (issue 43): ``memtrain train JOB`` as a user writes the job -- every setting at
its default but ``train.workers = 2``, ``train.tasks_per_update = 2``, the batch (512), the optimizer (SGD, lr
0.01), the epochs and the run directory -- and ``python benchmarks/torch_ddp_script.py`` (2 ranks on gloo, data
in memory, by default a new row permutation every epoch, as memtrain's default order), both as whole
processes started by ``subprocess``, timed by wall clock. Each method runs E and 2E epochs; an update's cost
is the difference over the E epochs' extra updates, so start-up (imports, spawning, the dataset read) cancels.
The methods run interleaved (A B A B ...), ``--repeats`` times; medians with their ranges, and the ratio
DDP ÷ memtrain per repeat. ``--variant NAME=SET[;SET]`` adds memtrain runs with ``--set`` overrides (to find
what costs what); ``--ddp-order batches`` adds DDP on contiguous batches (the bench's baseline). The dataset
is the bench's synthetic one (memtrain/benchmarks/synthetic.py: 1024 features, 10 classes, 40 updates an
epoch, 512 validation rows). The load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from memtrain.benchmarks.synthetic import mlp_shape, write_dataset

BATCH, UPDATES, VAL_ROWS = 512, 40, 512
SCRIPT = Path(__file__).with_name("torch_ddp_script.py")
FACTORY = "memtrain.benchmarks.torch_peers:benchmark_mlp"


def default_epochs(params: float) -> int:
    """E: 15 epochs (600 updates) up to 2e6 parameters, 2 above (an update at 1e7 computes for ~0.3 s)."""
    return 15 if params <= 2e6 else 2


def job_text(dataset: Path, hidden: int, run_dir: Path) -> str:
    return (f'[data]\npath = "{dataset}"\n\n[model]\nkind = "torch"\nfactory = "{FACTORY}"\nhidden = {hidden}\n\n'
            f'[train]\nbatch_size = {BATCH}\ntasks_per_update = 2\nworkers = 2\noptimizer = "sgd"\nlr = 0.01\n'
            f'seed = 0\n\n[run]\ndir = "{run_dir}"\n')


def timed(command: list[str], cpu: list[float] | None = None) -> float:
    """The wall seconds of ``command`` as a whole process; its user + system seconds (and its children's, the
    ones it waited for) appended to ``cpu``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    spent = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n{done.stderr[-2000:]}")
    if cpu is not None:
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return spent


def commands(method: str, sets: list[str], epochs: int, dataset: Path, hidden: int, job: Path,
             run_dir: Path) -> list[str]:
    if method.startswith("ddp"):
        order = "batches" if method == "ddp[batches]" else "rows"
        return [sys.executable, str(SCRIPT), str(dataset), "--hidden", str(hidden), "--epochs", str(epochs),
                "--order", order]
    extra = [arg for s in sets for arg in ("--set", s)]
    return ["memtrain", "train", str(job), "-q", "--overwrite", "--set", f"train.epochs={epochs}", *extra,
            "--run-dir", str(run_dir)]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1e6,1e7")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, help="E (default 15 up to 2e6 parameters, 2 above)")
    parser.add_argument("--variant", action="append", default=[], help="NAME=SECTION.KEY=VALUE[;...]: memtrain "
                        "again with these --set overrides")
    parser.add_argument("--ddp-order", default="rows", help="rows, batches or rows,batches")
    parser.add_argument("--no-default", action="store_true", help="leave out memtrain's default job")
    parser.add_argument("--scratch", default=os.environ.get("MEMTRAIN_BENCH_SCRATCH", tempfile.gettempdir()))
    parser.add_argument("--json", help="write every time to this file")
    args = parser.parse_args()
    variants = {} if args.no_default else {"memtrain": []}
    for text in args.variant:
        name, _, sets = text.partition("=")
        variants[f"memtrain[{name}]"] = [s for s in sets.split(";") if s]
    methods = list(variants) + [("ddp" if o == "rows" else f"ddp[{o}]") for o in args.ddp_order.split(",")]
    scratch = Path(args.scratch) / "torch-outside"
    scratch.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {os.getloadavg()}", flush=True)
    results = []
    for size in args.sizes.split(","):
        shape = mlp_shape(int(float(size)))
        dataset = write_dataset(scratch / f"data-{shape.params}", UPDATES * BATCH, VAL_ROWS)
        job = scratch / f"job-{shape.params}.toml"
        job.write_text(job_text(dataset, shape.hidden, scratch / "run"))
        e = args.epochs or default_epochs(shape.params)
        times: dict[str, dict[int, list[float]]] = {m: {e: [], 2 * e: []} for m in methods}
        cpus: dict[str, dict[int, list[float]]] = {m: {e: [], 2 * e: []} for m in methods}
        for repeat in range(args.repeats):
            for method in methods:
                for epochs in (e, 2 * e):
                    command = commands(method, variants.get(method, []), epochs, dataset, shape.hidden, job,
                                       scratch / "run")
                    times[method][epochs].append(timed(command, cpus[method][epochs]))
            print(f"  {shape.params:,} params, repeat {repeat + 1}: load {os.getloadavg()[0]:.1f}; " + ", ".join(
                f"{m} {times[m][e][-1]:.1f}/{times[m][2 * e][-1]:.1f} s" for m in methods), flush=True)
        per_update = {m: [(b - a) / (e * UPDATES) * 1e3 for a, b in zip(times[m][e], times[m][2 * e], strict=True)]
                      for m in methods}
        base = next(m for m in methods if not m.startswith("ddp"))
        print(f"\n{shape.params:,} parameters, E = {e} and 2E = {2 * e} epochs of {UPDATES} updates, "
              f"{args.repeats} interleaved repeats; ms per update, whole seconds at E and 2E; median (min-max)")
        print(f"| method | ms/update | E run s | 2E run s | {base} ÷ method (per repeat) | CPU ms/update |")
        print("|---|---:|---:|---:|---:|---:|")
        for m in methods:
            ratios = [d / b for b, d in zip(per_update[base], per_update[m], strict=True)]
            cpu_update = [(b - a) / (e * UPDATES) * 1e3 for a, b in zip(cpus[m][e], cpus[m][2 * e], strict=True)]
            print(f"| {m} | {spread(per_update[m])} | {spread(times[m][e])} | {spread(times[m][2 * e])} | "
                  f"{spread(ratios)} | {spread(cpu_update)} |")
        results.append({"params": shape.params, "epochs": e, "times": {m: {str(k): v for k, v in t.items()}
                                                                        for m, t in times.items()},
                        "cpu": {m: {str(k): v for k, v in t.items()} for m, t in cpus.items()}})
    print(f"\nload average after: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
