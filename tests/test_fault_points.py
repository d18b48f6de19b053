"""Every fault point declared in memtrain/faults.py is reached by the command it belongs to, and a
MEMTRAIN_FAULT naming a point that does not exist is refused (a fault test that can never fire cannot fail)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from in_process import here
from tiny_data import blobs, write_dataset

from memtrain.faults import POINTS
from memtrain.prepare.synthetic import write_synthetic_source

pytestmark = pytest.mark.timeout(180)
TESTS = Path(__file__).parent
PYTHONPATH = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))  # and the caller's
TRAIN = {"before_grad_write", "after_grad_write", "mid_step", "after_publish", "after_result", "after_update_logged",
         "ckpt_after_data", "ckpt_before_commit", "run_before_commit", "write"}
PREPARE = {"prepare_mid_spool", "prepare_mid_shard", "prepare_after_shard", "prepare_before_publish", "write"}
SERVE = {"serve_after_claim", "serve_after_launch"}
STALENESS = {"mid_publish"}  # fixed staleness in the rounds
ADDITIVE = {"statistics_chunk", "statistics_summed"}  # an additive model's pass
RL = {"rl_mid_collect", "rl_after_publish", "rl_mid_share"}  # reinforcement learning (memtrain/rl/server.py)
DESK = {"desk_done"}  # async mode at the desk (memtrain/train/loops/desk.py)


def memtrain(*args: object, points: set[str], log: Path) -> subprocess.CompletedProcess:
    """``memtrain ARGS`` in this process (tests/in_process.py: no point kills anything here, each is recorded),
    with ``points`` armed in it and in every process it starts."""
    return here(*args, env={"PYTHONPATH": PYTHONPATH, "MEMTRAIN_FAULT": ",".join(f"{p}:1" for p in sorted(points)),
                            "MEMTRAIN_FAULT_ACTION": "record", "MEMTRAIN_FAULT_LOG": str(log)})


def fired(log: Path) -> set[str]:
    return set(log.read_text().split()) if log.exists() else set()


def test_the_scenarios_cover_every_declared_point() -> None:
    assert set(POINTS) == TRAIN | STALENESS | PREPARE | SERVE | ADDITIVE | RL | DESK


def job(folder: Path, data: Path, name: str = "job", hidden: int = 8) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(f'[data]\npath = "{data}"\n[model]\nkind = "mlp"\nhidden = [{hidden}]\n[train]\nepochs = 2\n'
                    f'batch_size = 100\ntasks_per_update = 2\nworkers = 2\n[run]\ndir = "{folder / "run"}"\n')
    return path


def test_every_train_point_fires(tmp_path: Path) -> None:
    x, y = blobs(n=500, features=4, classes=3)
    data = write_dataset(tmp_path / "data", x, y, shard_rows=200)
    result = memtrain("train", job(tmp_path, data), points=TRAIN, log=tmp_path / "fired")
    assert result.returncode == 0, result.stderr
    assert fired(tmp_path / "fired") == TRAIN


def test_the_statistics_points_fire(tmp_path: Path) -> None:
    x, y = blobs(n=500, features=4, classes=3)
    data = write_dataset(tmp_path / "data", x, y, shard_rows=200)
    path = job(tmp_path, data)
    path.write_text(path.read_text().replace('kind = "mlp"\nhidden = [8]', 'kind = "ridge"'))
    result = memtrain("train", path, points=ADDITIVE, log=tmp_path / "fired")
    assert result.returncode == 0, result.stderr
    assert fired(tmp_path / "fired") == ADDITIVE


def test_the_staleness_point_fires(tmp_path: Path) -> None:
    x, y = blobs(n=500, features=4, classes=3)
    data = write_dataset(tmp_path / "data", x, y, shard_rows=200)
    result = memtrain("train", job(tmp_path, data), "--set", "train.staleness=1", "--set",
                      'train.staleness_in="rounds"', points=STALENESS, log=tmp_path / "fired")
    assert result.returncode == 0, result.stderr
    assert fired(tmp_path / "fired") == STALENESS


def test_the_desk_point_fires(tmp_path: Path) -> None:
    x, y = blobs(n=500, features=4, classes=3)
    data = write_dataset(tmp_path / "data", x, y, shard_rows=200)
    result = memtrain("train", job(tmp_path, data), "--set", 'train.mode="async"', points=DESK, log=tmp_path / "fired")
    assert result.returncode == 0, result.stderr
    assert fired(tmp_path / "fired") == DESK


def test_the_reinforcement_learning_points_fire(tmp_path: Path) -> None:
    path = tmp_path / "rl.toml"
    path.write_text('[env]\nid = "CartPole-v1"\nslots = 2\nsteps = 16\n[model]\nhidden = [8]\n[train]\n'
                    'env_steps = 64\nworkers = 1\nlearner = "workers"\nlearner_chunks = 2\n'
                    f'[run]\ndir = "{tmp_path / "run"}"\n')
    result = memtrain("train", path, points=RL, log=tmp_path / "fired")
    assert result.returncode == 0, result.stderr
    assert fired(tmp_path / "fired") == RL


def test_every_prepare_point_fires(tmp_path: Path) -> None:
    (source,) = write_synthetic_source(tmp_path / "s.csv", 12_000, 16, seed=3)
    result = memtrain("prepare", source, tmp_path / "ds", "--shard-mb", "0.1", "--chunk-mb", "0.5", points=PREPARE,
                      log=tmp_path / "fired")
    assert result.returncode == 0, result.stderr
    assert fired(tmp_path / "fired") == PREPARE


def test_every_serve_point_fires(tmp_path: Path) -> None:
    x, y = blobs(n=300, features=4, classes=3)
    data = write_dataset(tmp_path / "data", x, y, shard_rows=200)
    spool = tmp_path / "jobs"
    spool.mkdir(mode=0o700)
    job(spool, data, "k").write_text(job(tmp_path, data).read_text())
    result = memtrain("serve", "--jobs", spool, "--once", points=SERVE, log=tmp_path / "fired")
    assert result.returncode == 0, result.stderr
    assert fired(tmp_path / "fired") == SERVE


@pytest.mark.parametrize(("spec", "message"), [
    ("after_grad_tmp:2", "unknown fault point 'after_grad_tmp' in MEMTRAIN_FAULT"),
    ("mid_step:0", "bad hit count for fault point 'mid_step'"),
    ("mid_step:x", "bad hit count for fault point 'mid_step'"),
])
def test_an_unknown_point_or_count_is_refused(tmp_path: Path, spec: str, message: str) -> None:
    result = here("inspect", tmp_path, env={"MEMTRAIN_FAULT": spec})
    assert result.returncode == 2
    assert message in result.stderr and "expected" in result.stderr


def test_the_spec_is_read_once_per_process_and_again_by_every_command(tmp_path: Path, cli, small_table,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A fault point reads MEMTRAIN_FAULT once (it runs on every update); a command reads it afresh at its
    start, so a fault set for a whole process still fires -- here a full disk at prepare's first write."""
    from conftest import table_csv

    from memtrain.faults import fault_point

    fault_point("write")  # the process has read the spec: none
    monkeypatch.setenv("MEMTRAIN_FAULT", "write:1")
    monkeypatch.setenv("MEMTRAIN_FAULT_ACTION", "raise")
    fault_point("write")  # still none: the spec is not read again between two fault points
    source = tmp_path / "t.csv"
    source.write_text(table_csv(*small_table))
    result = cli("prepare", source, tmp_path / "ds")
    assert result.code == 1
    assert "no space left" in result.err
    assert not (tmp_path / "ds").exists()
