"""The update of a reinforcement-learning run in the server or across the workers (``train.learner``, docs/rl.md
"The update across the workers"): what each costs for a larger policy.

Run: ``python -m benchmarks.rl_learner [--hidden 256 256] [--chunks 2] [--workers 1] [--repeats 3] [--dir DIR]``.
PPO on CartPole-v1, 8 slots x 256 steps per version, 8 epochs x 2 minibatches (1,024 rows each), through
``memtrain train`` itself; the two placements interleaved, ``--repeats`` runs each. Per run, the median over its
versions of the update's time: a version's seconds minus its collection's (``slots x steps / env_steps_per_s``,
both in metrics.jsonl). Both placements compute the same bits (the same ``learner_chunks``); the final weights'
digests are printed to show it. Figures move with the machine's load (printed beside them).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

JOB = """[env]
id = "CartPole-v1"
slots = 8
steps = 256
[model]
kind = "mlp"
hidden = {hidden}
[train]
algorithm = "ppo"
env_steps = {budget}
epochs = 8
minibatches = 2
seed = 1
eval_every = 0
learner_chunks = {chunks}
[run]
dir = "run"
"""


def update_seconds(run: Path) -> list[float]:
    from memtrain.files import read_jsonl
    from memtrain.layout import RUN_METRICS

    return [line["seconds"] - 8 * 256 / line["env_steps_per_s"] for line in read_jsonl(run / RUN_METRICS)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[256, 256])
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--versions", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    from memtrain.cli import main as memtrain
    from memtrain.files import open_npy
    from memtrain.layout import weights_path

    folder = Path(args.dir or tempfile.mkdtemp(prefix="rl-learner-"))
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.toml"
    job.write_text(JOB.format(hidden=list(args.hidden), budget=args.versions * 8 * 256, chunks=args.chunks))
    times: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for learner in ("server", "workers"):
            run = folder / learner
            began = time.perf_counter()
            assert memtrain(["train", str(job), "-q", "--workers", str(args.workers), "--run-dir", str(run),
                             "--overwrite", "--set", f"train.learner={learner}"]) == 0
            wall = time.perf_counter() - began
            times.setdefault(learner, []).append(statistics.median(update_seconds(run)))
            digest = hashlib.sha256(np.array(open_npy(weights_path(run, args.versions))).tobytes()).hexdigest()[:16]
            print(f"learner {learner:7}: update {times[learner][-1]:.3f} s per version (median), run {wall:.1f} s, "
                  f"weights {digest}, load {os.getloadavg()[0]:.1f}", flush=True)
    for learner, values in times.items():
        print(f"{learner:7}: median {statistics.median(values):.3f} s per update, range {min(values):.3f} to "
              f"{max(values):.3f} ({len(values)} runs)")


if __name__ == "__main__":
    main()
