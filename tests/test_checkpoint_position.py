"""Every field of a checkpoint's position is checked for type and range, and a checkpoint that fails is skipped
for the previous one (issue 30, defect 8): a seal recomputed by hand over a string in ``position.bases`` crashed
resume with a traceback; duplicates, 10^15 and negative values were accepted (docs/faults.md)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tiny_data import blobs, write_dataset

from memtrain.errors import CorruptFileError
from memtrain.files import SEAL_KEY, seal
from memtrain.layout import CHECKPOINT_META, checkpoint_path, checkpoint_updates
from memtrain.train.records.checkpoint import verify_checkpoint

pytestmark = pytest.mark.timeout(120)

JOB = """
[data]
path = "{data}"

[model]
kind = "softmax"

[train]
epochs = 2
batch_size = 200
tasks_per_update = 2
lr = 0.1
workers = 0
staleness = 1

[run]
dir = "run"
keep_checkpoints = 5
"""


def memtrain(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memtrain", *map(str, args)], capture_output=True, text=True,
                          timeout=100)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two epochs at fixed staleness 1 (so ``position.planned.bases`` is not empty), a checkpoint after each."""
    folder = tmp_path_factory.mktemp("ckpt")
    x, y = blobs(n=1000, features=4, classes=3, seed=2)
    (folder / "job.toml").write_text(JOB.format(data=write_dataset(folder / "data", x, y, shard_rows=300)))
    result = memtrain("train", folder / "job.toml")
    assert result.returncode == 0, result.stderr
    return folder / "run"


def reseal(checkpoint: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change the metadata and recompute its seal, as a careful hand would."""
    path = checkpoint / CHECKPOINT_META
    meta = {k: v for k, v in json.loads(path.read_text()).items() if k != SEAL_KEY}
    change(meta["position"])
    path.write_text(json.dumps(seal(meta), indent=2))


BAD = {
    "bases-string": ("planned.bases",
                     lambda p: p["planned"]["bases"].__setitem__(0, [p["planned"]["bases"][0][0], "7"])),
    "bases-duplicate": ("planned.bases", lambda p: p["planned"]["bases"].append(list(p["planned"]["bases"][-1]))),
    "bases-future": ("planned.bases",
                     lambda p: p["planned"]["bases"].__setitem__(0, [p["planned"]["bases"][0][0], p["version"] + 1])),
    "bases-not-pairs": ("planned.bases", lambda p: p["planned"].__setitem__("bases", [[1, 2, 3]])),
    "planned-list": ("planned.bases", lambda p: p.__setitem__("planned", [])),
    "epoch-huge": ("epoch", lambda p: p.__setitem__("epoch", 10**15)),
    "version-negative": ("version", lambda p: p.__setitem__("version", -1)),
    "batch-float": ("batch", lambda p: p.__setitem__("batch", 1.5)),
    "applied-duplicate": ("arrival.applied", lambda p: p.__setitem__("arrival", {"applied": [3, 3]})),
    "applied-negative": ("arrival.applied", lambda p: p.__setitem__("arrival", {"applied": [-2]})),
    "applied-missing": ("arrival.applied", lambda p: p.__setitem__("arrival", {})),
    "epoch_loss-string": ("epoch_loss", lambda p: p.__setitem__("epoch_loss", "0.5")),
    "best-list": ("best", lambda p: p.__setitem__("best", [1])),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_nonsense_position_field_is_a_damaged_checkpoint(run: Path, tmp_path: Path, case: str) -> None:
    key, change = BAD[case]
    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint_path(run, checkpoint_updates(run)[-1]), copy)
    verify_checkpoint(copy)
    reseal(copy, change)
    with pytest.raises(CorruptFileError, match=f"position.{key}"):
        verify_checkpoint(copy)


def test_resume_skips_it_for_the_previous_checkpoint(run: Path, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    newest, previous = checkpoint_updates(copy)[-1], checkpoint_updates(copy)[-2]
    reseal(checkpoint_path(copy, newest), BAD["bases-string"][1])
    result = memtrain("train", "--resume", copy, "--set", "train.epochs=3")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    events = (copy / "events.log").read_text()
    assert f"skipping checkpoint {checkpoint_path(copy, newest).name}" in events and "position.planned.bases" in events
    assert f"resumed from {checkpoint_path(copy, previous).name}" in events


# A run made by the code before the schedules owned their state (88bcd0a: the job above, its [run] dir elsewhere):
# its checkpoints keep ``bases`` and ``applied`` at the position's top level. Its dataset is beside it.
BEFORE = Path(__file__).parent / "fixtures" / "staleness-88bcd0a"


def test_a_checkpoint_written_before_schedules_owned_their_state_resumes_bitwise(tmp_path: Path) -> None:
    shutil.copytree(BEFORE, tmp_path / "before")
    run = tmp_path / "before" / "run"
    job = json.loads((run / "job.json").read_text())
    job["data"]["path"] = str(tmp_path / "before" / "data")  # where the copy's dataset is (the run names its own)
    (run / "job.json").write_text(json.dumps(seal({k: v for k, v in job.items() if k != SEAL_KEY}), indent=2))
    old = json.loads((checkpoint_path(run, checkpoint_updates(run)[-1]) / CHECKPOINT_META).read_text())["position"]
    assert old["bases"] and "planned" not in old, "the fixture is a checkpoint of the old layout"
    result = memtrain("train", "--resume", run, "--set", "train.epochs=3")
    assert result.returncode == 0, result.stderr
    assert "resumed from c00000010" in (run / "events.log").read_text()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "job.toml").write_text(JOB.format(data=tmp_path / "before" / "data").replace("epochs = 2", "epochs = 3"))
    assert memtrain("train", fresh / "job.toml").returncode == 0
    newest = max((run / "weights").glob("v*.npy"))
    assert newest.name == max((fresh / "run" / "weights").glob("v*.npy")).name
    assert newest.read_bytes() == (fresh / "run" / "weights" / newest.name).read_bytes(), "bitwise the same run"
    now = json.loads((checkpoint_path(run, checkpoint_updates(run)[-1]) / CHECKPOINT_META).read_text())["position"]
    assert now["planned"]["bases"] and "bases" not in now, "a new checkpoint keeps the state under the schedule's name"
