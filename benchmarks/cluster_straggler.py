"""A cluster run with a straggler against the same run healthy (issue 43: "a cluster straggler costs <= 1.5x").

Run: ``python -m benchmarks.cluster_straggler [--repeats 3] [--stopped 0.8] [--workers 2] [--json]``. Each run is a
whole ``memtrain train jobs/examples/digits-mlp.toml --cluster local:N`` process (the README's first job on the
shipped digits, prepared once into a scratch directory), timed from its start to its exit. In the straggled run
one Dask worker is stopped from outside (SIGSTOP/SIGCONT, memtrain/benchmarks/outside_straggler.py) for
``--stopped`` of every 30 ms, anywhere in its work, as an outside harness did (one of 2 workers stopped 80 % of the
time). Healthy and straggled runs are interleaved; the table gives their medians and ranges, the ratio pair by
pair, the load average before and after, and whether both runs ended with the same weights (the tasks are pure,
so the backups and the order of who runs what never change a bit).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from memtrain.benchmarks.compare import Spread, Target, interleaved, pairwise
from memtrain.benchmarks.first_job import JOB, prepare_digits
from memtrain.benchmarks.outside_straggler import run_straggled

TARGET = Target(name="cluster run with a straggler / healthy", at_most=1.5)


def final_digest(run_dir: Path) -> str:
    """A digest of the run's last weight file (its bits)."""
    weights = sorted((run_dir / "weights").glob("*.npy"))
    return hashlib.sha256(weights[-1].read_bytes()).hexdigest()[:16] if weights else ""


def one_run(dataset: Path, run_dir: Path, workers: int, stopped: float) -> dict[str, Any]:
    """One whole ``memtrain train`` process, straggled when ``stopped`` > 0: its seconds, digest and backups."""
    command = [sys.executable, "-m", "memtrain", "train", str(JOB), "--overwrite", "--run-dir", str(run_dir),
               "--set", f'data.path="{dataset}"', "--cluster", f"local:{workers}", "-q"]
    seconds = run_straggled(command, stopped, "the straggled cluster run")
    events = (run_dir / "events.log").read_text(encoding="utf-8")
    return {"seconds": seconds, "digest": final_digest(run_dir), "backups": events.count("a backup copy (attempt"),
            "set_aside": events.count("set aside")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stopped", type=float, default=0.8, help="fraction of the time one worker is stopped")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="memtrain-straggler-"))
    try:
        dataset = prepare_digits(scratch)
        load_before = os.getloadavg()
        stops = {"healthy": 0.0, "straggled": args.stopped}
        runs = interleaved(list(stops), args.repeats, lambda name, repeat: one_run(
            dataset, scratch / f"{name}-{repeat}", args.workers, stops[name]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ratio = pairwise([run["seconds"] for run in runs["straggled"]], [run["seconds"] for run in runs["healthy"]])
    digests = {run["digest"] for side in runs.values() for run in side}
    report = {"workers": args.workers, "stopped": args.stopped, "repeats": args.repeats,
              "loadavg_before": load_before, "loadavg_after": os.getloadavg(), "runs": runs,
              "ratio": ratio.as_dict() if ratio else None, "same_bits": len(digests) == 1}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"memtrain train {JOB.name} --cluster local:{args.workers}, whole runs; one worker stopped "
          f"{args.stopped:.0%} of the time; load average before "
          f"{' '.join(f'{x:.2f}' for x in load_before)}, after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for name, side in runs.items():
        spread = Spread.of([run["seconds"] for run in side])
        print(f"  {name:9} {spread.text(2)} s; backups per run {[run['backups'] for run in side]}, "
              f"workers set aside {[run['set_aside'] for run in side]}")
    if ratio is not None:
        print(TARGET.verdict(ratio))
    print(f"same final weights in every run: {'yes' if report['same_bits'] else 'NO'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
