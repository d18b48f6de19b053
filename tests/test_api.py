"""The Python API: memtrain.fit from a plain script (no __main__ guard), from `python -c` and `python -m`;
load_job with str paths; dir/help; Dataset repr, len, rows, batches, pickling, and a PyTorch DataLoader."""

from __future__ import annotations

import os
import pickle
import pydoc
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

import memtrain
from memtrain.config import load_job
from memtrain.dataset import open_dataset
from memtrain.errors import InputError
from memtrain.train.plan import epoch_updates

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent

JOB = """
[data]
path = "data/blobs"

[model]
kind = "softmax"

[train]
epochs = 2
batch_size = 200
workers = 2
"""

SCRIPT = """
import memtrain
print("top of the script")
summary = memtrain.fit("job.toml", train={"epochs": 3, "lr": 0.05}, quiet=True)
print("epochs", summary.epochs, "version", summary.version)
print("accuracy", summary.final["val_accuracy"] > 0.5)
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1000, features=6, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=300)


def project(tmp_path: Path, dataset: Path) -> Path:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "blobs").symlink_to(dataset)
    (tmp_path / "job.toml").write_text(JOB)
    return tmp_path


@pytest.mark.parametrize("how", ["script", "python -c", "python -m"])
def test_fit_runs_without_a_main_guard(tmp_path: Path, dataset: Path, how: str) -> None:
    """A script that calls memtrain.fit at top level runs once; its workers do not run it again."""
    folder = project(tmp_path, dataset)
    (folder / "train_it.py").write_text(SCRIPT)
    argv = {"script": ["train_it.py"], "python -c": ["-c", SCRIPT], "python -m": ["-m", "train_it"]}[how]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)])}
    done = subprocess.run([sys.executable, *argv], cwd=folder, env=env, capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout.splitlines() == ["top of the script", "epochs 3 version 15", "accuracy True"]
    assert (folder / "runs" / "job" / "checkpoints").is_dir()


def test_fit_runs_in_a_jupyter_notebook(tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same lines as cells of a notebook, executed by a real IPython kernel (ipykernel + nbclient)."""
    import nbclient  # in the test extra: installed wherever the tests run
    import nbformat
    folder = project(tmp_path, dataset)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), str(folder)]))  # the kernel's environment
    cells = [nbformat.v4.new_code_cell(source) for source in SCRIPT.strip().split("\n")]
    notebook = nbformat.v4.new_notebook(cells=cells)
    nbclient.NotebookClient(notebook, timeout=100, kernel_name="python3",
                            resources={"metadata": {"path": str(folder)}}).execute()
    printed = [out.get("text", "") for cell in notebook.cells for out in cell.outputs if out.output_type == "stream"
               and out.name == "stdout"]
    errors = [out for cell in notebook.cells for out in cell.outputs if out.output_type == "error"]
    assert not errors, errors
    assert "".join(printed).splitlines() == ["top of the script", "epochs 3 version 15", "accuracy True"]
    assert (folder / "runs" / "job" / "checkpoints").is_dir()


def test_fit_overrides_and_errors(tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = project(tmp_path, dataset)
    monkeypatch.chdir(folder)
    with pytest.raises(InputError, match=r"unknown keyword argument trian=") as caught:
        memtrain.fit("job.toml", trian={"epochs": 1})
    assert caught.value.exit_code == 2
    with pytest.raises(InputError, match=r"unknown key train.epocs .*did you mean `epochs`\?"):
        memtrain.fit("job.toml", train={"epocs": 1})
    summary = memtrain.fit("job.toml", train={"epochs": 1}, run={"dir": "elsewhere"}, workers=1, quiet=True)
    assert summary.epochs == 1 and summary.run_dir == folder / "elsewhere"
    resumed = memtrain.fit(resume="elsewhere", train={"epochs": 2}, quiet=True)
    assert resumed.epochs == 2 and resumed.version == 10


def test_load_job_takes_str_paths(tmp_path: Path, dataset: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = project(tmp_path, dataset)
    monkeypatch.chdir(folder)
    job = load_job("job.toml", run_dir="out/run", values={"train.epochs": 4, "data.path": "data/blobs"})
    assert job.train.epochs == 4
    assert job.data.path == dataset.resolve()
    assert job.run.dir == folder / "out" / "run"
    assert job.source == folder / "job.toml"


def test_dir_and_help_show_the_api() -> None:
    listed = dir(memtrain)
    for name in ("fit", "load_job", "open_dataset", "Dataset", "load_model", "TrainedModel", "load_checkpoint",
                 "MemtrainError", "__version__"):
        assert name in listed and name in memtrain.__all__
        assert getattr(memtrain, name) is not None
    assert "importlib" not in listed and "TYPE_CHECKING" not in listed
    text = pydoc.render_doc(memtrain, renderer=pydoc.plaintext)
    assert "fit(job" in text and "Train a job, or resume a run" in text
    assert "batches(self, batch_size" in text and "load_model(path" in text
    with pytest.raises(AttributeError):
        memtrain.no_such_thing  # noqa: B018


def test_dataset_repr_len_and_rows(dataset: Path) -> None:
    ds = open_dataset(str(dataset))
    assert repr(ds) == (f"Dataset({str(dataset)!r}: classification, 3 classes; x (6,) float32; "
                        "train 900 rows, val 100 rows)")
    assert repr(ds.split("val")) == "Split('val': 100 rows in 1 shard)"
    x_all, y_all = blobs(n=1000, features=6, classes=3)
    x_train, y_train = x_all[100:], y_all[100:]  # tiny_data puts the first rows in val
    assert len(ds) == 900 and len(ds.split("val")) == 100
    x, y = ds[299]
    np.testing.assert_array_equal(x, x_train[299])
    assert y == y_train[299] and x.flags.writeable
    rows = [0, 299, 300, 899, -1, 5]  # across the shard boundaries, negative, unsorted
    x, y = ds[rows]
    np.testing.assert_array_equal(x, x_train[rows])
    np.testing.assert_array_equal(y, y_train[rows])
    x, y = ds[250:650:3]
    np.testing.assert_array_equal(x, x_train[250:650:3])
    np.testing.assert_array_equal(ds.split("val")[7][0], x_all[7])
    with pytest.raises(IndexError):
        ds[900]
    with pytest.raises(InputError, match="no 'test' split"):
        ds.split("test")


def test_batches_are_the_training_plans_batches(dataset: Path) -> None:
    ds = open_dataset(dataset)
    x_train = blobs(n=1000, features=6, classes=3)[0][100:]
    for epoch in (0, 1):
        got = list(ds.batches(128, seed=5, epoch=epoch, shuffle="batches"))
        plan = [(u.tasks[0].lo, u.tasks[-1].hi) for u in epoch_updates(900, 128, 1, 5, epoch, shuffle="batches")]
        assert [len(x) for x, _ in got] == [hi - lo for lo, hi in plan]
        for (x, y), (lo, hi) in zip(got, plan, strict=True):
            np.testing.assert_array_equal(x, x_train[lo:hi])
            assert not x.flags.writeable and not y.flags.writeable
    one_shard = next(x for x, _ in ds.batches(100, shuffle=False))
    assert isinstance(one_shard.base, np.memmap) or isinstance(one_shard, np.memmap)  # a view: no copy
    assert [len(x) for x, _ in ds.batches(400, shuffle=False, drop_last=True)] == [400, 400]
    assert sum(len(x) for x, _ in ds.batches(64, split="val")) == 100
    with pytest.raises(InputError, match=r"batch_size must be an integer from 1 to 2\*\*63 - 1"):
        next(ds.batches(0))


def test_a_pickled_dataset_carries_no_rows(dataset: Path) -> None:
    ds = open_dataset(dataset)
    for _ in ds.batches(100):
        pass  # every shard is mapped now
    blob = pickle.dumps(ds)
    assert len(blob) < 8_000  # paths and the manifest, not the 24 KB of rows
    again = pickle.loads(blob)
    np.testing.assert_array_equal(again[[1, 500]][0], ds[[1, 500]][0])


def test_a_torch_dataloader_with_two_workers_reads_the_mapped_shards(dataset: Path) -> None:
    import torch
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    ds = open_dataset(dataset)
    x_train = torch.from_numpy(blobs(n=1000, features=6, classes=3)[0][100:])
    rows = DataLoader(ds, batch_size=64, shuffle=False, num_workers=2)  # row by row, collated by torch
    assert torch.equal(torch.cat([x for x, _ in rows]), x_train)
    batched = DataLoader(ds, batch_size=None, num_workers=2,
                         sampler=BatchSampler(SequentialSampler(range(len(ds))), batch_size=128, drop_last=False))
    seen = list(batched)  # one fancy-indexed read per batch (a spawned worker gets the pickle tested above)
    assert [len(x) for x, _ in seen] == [128] * 7 + [4]
    assert torch.equal(torch.cat([torch.as_tensor(x) for x, _ in seen]), x_train)
