"""Following one update by hand stays within a handful of files (benchmarks/follow_update.py; docs/development.md,
"Following one update"): a guard that fails when a change tangles an update's path again.

The follower runs a tiny job under a profile hook and counts, between the 5th and the 6th call of the mode's
per-update function, the files of memtrain/train/ entered and the returns (calls back into a file already left).
The counts are the code's, but the server's chores (every PROGRESS_SECONDS) may fall inside the followed update on a
loaded machine: the bounds are the counts of the code as it is with the chores inside (measured with
PROGRESS_SECONDS = 0). Without them: sync 10 files / 32 returns, cluster 10 / 26, async in the server 14 / 53 (from
20 / 70 before issue 39's second step: main's code fails the async bound).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import memtrain

REPO = Path(__file__).resolve().parent.parent
# (files of train/, returns into train/) at most, per mode
BOUNDS = {"sync": (16, 48), "async": (15, 55), "cluster": (16, 44)}


def follow(mode: str, folder: Path) -> dict:
    """The follower's counts for ``mode``, run on the memtrain this test imports (and benchmarks/ of this
    checkout), in a fresh process."""
    code = str(Path(memtrain.__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys([code, str(REPO)]))}
    result = subprocess.run([sys.executable, "-m", "benchmarks.follow_update", mode, "--json", "--dir", str(folder)],
                            capture_output=True, text=True, timeout=300, env=env, cwd=folder)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("mode", sorted(BOUNDS))
def test_one_update_stays_within_a_handful_of_files(tmp_path: Path, mode: str) -> None:
    counts = follow(mode, tmp_path)
    assert counts["calls"] >= 6, "the per-update function ran at least 6 times: the window closed"
    files, returns = BOUNDS[mode]
    assert counts["train_files"] <= files, f"{mode}: one update enters {counts['train_files']} files of train/"
    assert counts["train_returns"] <= returns, f"{mode}: one update returns {counts['train_returns']} times"
    assert counts["train_files"] >= 5 and counts["train_returns"] > 0, "the follower saw the update's path"
