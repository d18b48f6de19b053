"""Async against sync on the README's first job with an outside straggler, as an outside harness ran it (issue 43).

Run: ``python -m benchmarks.async_first_job [--repeats 3] [--stopped 0.6667] [--async-group 1]``. Each run is a whole
``memtrain train jobs/examples/digits-mlp.toml`` process (the shipped digits, prepared once into a scratch directory;
``train.workers = 2``), timed from its start to its exit, sync and async (``train.mode = "async"``, its
``async_group`` as given: 1 is the default a user's job gets, 2 makes an update cover the rows of a sync one), each
without and with one worker stopped from outside for ``--stopped`` of every 30 ms (outside_straggler.py). Beside
the whole run, from the run's ``metrics.jsonl``: the seconds to its first update and the span of its updates (first
to last), so that start-up and the steady part are told apart. Everything interleaved; medians (ranges), the
async/sync speed ratio pair by pair, the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memtrain.benchmarks.compare import Spread, Target, interleaved, pairwise
from memtrain.benchmarks.first_job import JOB, prepare_digits
from memtrain.benchmarks.outside_straggler import run_straggled

TARGET = Target(name="async vs sync with a straggler, whole runs", at_least=1.5)


def one_run(dataset: Path, run_dir: Path, mode: str, group: int, stopped: float) -> dict[str, float]:
    options = ["--set", 'train.mode="async"', "--set", f"train.async_group={group}"] if mode == "async" else []
    command = [sys.executable, "-m", "memtrain", "train", str(JOB), "--overwrite", "--run-dir", str(run_dir),
               "--set", f'data.path="{dataset}"', "--set", "train.workers=2", "-q", *options]
    began = time.time()
    seconds = run_straggled(command, stopped, f"the straggled {mode} run")
    lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    times = [record["time"] for record in map(json.loads, lines) if record.get("kind") == "update"]
    return {"seconds": seconds, "first": times[0] - began, "span": times[-1] - times[0], "updates": len(times)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stopped", type=float, default=2 / 3, help="fraction of the time one worker is stopped")
    parser.add_argument("--async-group", type=int, default=1)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="memtrain-async-first-"))
    names = [f"{mode}, {side}" for side in ("healthy", "straggled") for mode in ("sync", "async")]
    try:
        dataset = prepare_digits(scratch)
        load_before = os.getloadavg()
        runs = interleaved(names, args.repeats, lambda name, repeat: one_run(
            dataset, scratch / f"{name.replace(', ', '-')}-{repeat}", name.split(",")[0], args.async_group,
            args.stopped if "straggled" in name else 0.0))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"memtrain train {JOB.name}, train.workers = 2, async_group {args.async_group}; whole runs; one worker "
          f"stopped {args.stopped:.0%} of the time in the straggled runs; load average before "
          f"{' '.join(f'{x:.2f}' for x in load_before)}, after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("| run | updates | whole run s | to the first update s | updates' span s |")
    print("|---|---|---|---|---|")
    for name in names:
        side: list[dict[str, Any]] = runs[name]
        cells = [Spread.of([run[key] for run in side]).text(2) for key in ("seconds", "first", "span")]
        print(f"| {name} | {side[0]['updates']} | " + " | ".join(cells) + " |")
    for side in ("healthy", "straggled"):
        ratio = pairwise([run["seconds"] for run in runs[f"sync, {side}"]],
                         [run["seconds"] for run in runs[f"async, {side}"]])
        if ratio is not None:
            print(f"{side}: " + (TARGET.verdict(ratio) if side == "straggled" else
                                 f"async speed / sync {ratio.text(2)}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
