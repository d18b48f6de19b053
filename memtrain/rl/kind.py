"""Whether a command's job or run is reinforcement learning: asked by every `memtrain train`, `inspect` and
`predict`, so it imports nothing of RL's engine (memtrain/rl/server.py, which pulls the learner, the policies and
the environments in: about 50 ms of start-up a supervised run never needs)."""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from memtrain.errors import MemtrainError
from memtrain.files import read_json
from memtrain.layout import RUN_JOB

RUN_FORMAT = "memtrain-rl-run"  # job.json's "kind" for a reinforcement-learning run


def is_rl_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a reinforcement-learning run (its job.json says so)."""
    try:
        record = read_json(Path(run_dir) / RUN_JOB, what="the run's job record")
    except MemtrainError:
        return False
    return isinstance(record, dict) and record.get("kind") == RUN_FORMAT


def wants_rl(args: argparse.Namespace) -> bool:
    """Whether ``memtrain train``'s arguments name a reinforcement-learning job or run."""
    if isinstance(args.resume, str):
        return is_rl_run(Path(args.resume))
    if args.replay is not None:
        return is_rl_run(Path(args.replay))
    if args.job is None or not Path(args.job).is_file():
        return False
    try:
        with open(args.job, "rb") as handle:
            return isinstance(tomllib.load(handle).get("env"), dict)
    except (OSError, tomllib.TOMLDecodeError):
        return False  # the supervised path reports the file's problem
