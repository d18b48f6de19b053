"""memtrain.fit as a Python user calls it: a job without a file (keywords or a dict, parsed and recorded as a
job file is), re-runs in Python terms, the summary as a short table; and a Dataset for one's own loop
(statistics in the feature dtype, the normalizer, torch paths without warnings)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_data import blobs, write_dataset

import memtrain
from memtrain.cli import main
from memtrain.config import job_from_dict, load_job
from memtrain.errors import InputError
from memtrain.train.records.record import job_record

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=500, features=5, classes=3)
    x[:, 2] = 7.25  # a constant column: zero variance on every split
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=200)


def sections(data: Path) -> dict:
    return {"data": {"path": str(data)}, "model": {"kind": "softmax"},
            "train": {"epochs": 2, "batch_size": 100, "workers": 0}}


def test_a_job_without_a_file_is_validated_and_recorded_as_a_job_file_is(tmp_path: Path, dataset: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    job = sections(dataset)
    summary = memtrain.fit(**job, run_dir="by-keywords", quiet=True)
    assert summary.epochs == 2 and summary.run_dir == tmp_path / "by-keywords"
    memtrain.fit(job, run_dir="by-dict", quiet=True)  # the same sections as one dict
    toml = tmp_path / "job.toml"
    toml.write_text(f'[data]\npath = "{dataset}"\n[model]\nkind = "softmax"\n'
                    '[train]\nepochs = 2\nbatch_size = 100\nworkers = 0\n')
    memtrain.fit(toml, run_dir="by-file", quiet=True)
    names = ("by-keywords", "by-dict", "by-file")
    recorded = [json.loads((tmp_path / name / "job.json").read_text()) for name in names]
    for record in recorded:
        record.pop("record_checksum")
    assert recorded[0] == recorded[1] == recorded[2] == job_record(load_job(toml))
    # the same parser: an unknown key, a wrong type and a value out of range, named as for a file
    with pytest.raises(InputError, match=r"^job: unknown key train.epocs .*did you mean `epochs`\?"):
        memtrain.fit(data=job["data"], train={"epocs": 3})
    with pytest.raises(InputError, match=r"wrong type for train.epochs \(expected int, found '3'\)"):
        memtrain.fit(job | {"train": {"epochs": "3"}})
    with pytest.raises(InputError,
                       match=r"run.keep_checkpoints out of range \(expected an integer from 1 to 10000, found 0\)"):
        memtrain.fit(**job, run={"keep_checkpoints": 0})
    with pytest.raises(InputError, match=r"unknown job 'trian'"):
        memtrain.fit({"trian": {}})
    with pytest.raises(InputError, match="a job is needed"):
        memtrain.fit()
    assert sorted(os.listdir(tmp_path)) == ["by-dict", "by-file", "by-keywords", "job.toml"]


def test_a_notebook_cell_run_again_gets_advice_in_python_terms(tmp_path: Path, dataset: Path) -> None:
    job, run = sections(dataset), tmp_path / "run"
    memtrain.fit(**job, run_dir=run, quiet=True)
    with pytest.raises(InputError, match="the run directory already exists") as caught:
        memtrain.fit(**job, run_dir=run, quiet=True)
    assert "overwrite=True" in str(caught.value) and "resume=True" in str(caught.value)
    assert "--" not in str(caught.value)  # no command-line flag
    more = memtrain.fit(**job | {"train": job["train"] | {"epochs": 3}}, run_dir=run, resume=True, quiet=True)
    assert more.epochs == 3 and more.version == 3 * 5
    with pytest.raises(InputError, match=r"cannot resume with train.epochs = 2") as caught:
        memtrain.fit(resume=run, train={"epochs": 2})
    assert f"memtrain.fit(resume={str(run)!r}, train={{'epochs': 4}})" in str(caught.value)
    again = memtrain.fit(**job, run_dir=run, overwrite=True, quiet=True)
    assert again.epochs == 2
    with pytest.raises(InputError, match="overwrite and resume contradict each other"):
        memtrain.fit(**job, run_dir=run, overwrite=True, resume=True)


def test_the_summary_is_a_short_table(tmp_path: Path, dataset: Path) -> None:
    summary = memtrain.fit(**sections(dataset), run_dir=tmp_path / "run", quiet=True)
    lines = str(summary).splitlines()
    assert repr(summary) == str(summary)
    assert re.fullmatch(rf"TrainSummary: 2 epochs, weight version 10, \d+\.\d s, run {tmp_path / 'run'}", lines[0])
    assert lines[1].split() == ["epoch", "loss", "val_loss", "val_accuracy", "val_macro_f1"]
    assert lines[2].split()[:2] == ["best", str(summary.best["epoch"])] and lines[3].split()[:2] == ["final", "2"]
    assert lines[3].split()[3] == f"{summary.final['val_loss']:.4f}"
    assert len(lines) == 4 and max(map(len, lines[1:])) <= 80
    html = summary._repr_html_()
    assert html.count("<tr>") == 3 and "<th>val_accuracy</th>" in html


def test_dataset_statistics_keep_the_feature_dtype_and_the_normalizer_never_divides_by_zero(dataset: Path) -> None:
    ds = memtrain.open_dataset(dataset)
    assert {key: value.dtype for key, value in ds.stats.items()} == dict.fromkeys(("mean", "std", "min", "max"),
                                                                               np.float32)
    assert ds.stats["std"][2] == 0
    x, _ = next(ds.batches(64, seed=0))
    normalized = ds.normalizer(x)
    assert normalized.dtype == np.float32 and normalized.flags.writeable and np.isfinite(normalized).all()
    np.testing.assert_array_equal(normalized[:, 2], 0)  # centred, not divided
    keep = [0, 1, 3, 4]
    expected = (x[:, keep] - ds.stats["mean"][keep]) / ds.stats["std"][keep]
    np.testing.assert_allclose(normalized[:, keep], expected, rtol=1e-5, atol=1e-5)
    job = job_from_dict(sections(dataset), base=Path.cwd())
    assert job.data.normalize  # the one the trained model applies (memtrain/train/normalize.py)


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def test_the_documented_own_loop_and_torch_paths_give_no_warning(tmp_path: Path) -> None:
    """The python-api.md blocks that read a Dataset (with numpy and with torch), run with UserWarnings as
    errors: a non-writable array given to torch warns."""
    pytest.importorskip("torch")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "digits.csv").symlink_to(ROOT / "data" / "digits.csv")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert main(["prepare", str(tmp_path / "data" / "digits.csv"), str(tmp_path / "data" / "digits")]) == 0
    chosen = [block for block in python_blocks(ROOT / "docs" / "python-api.md")
              if "open_dataset" in block and "load_model" not in block]
    assert len(chosen) >= 3 and any("torch.from_numpy" in block for block in chosen)
    script = tmp_path / "blocks.py"
    script.write_text("\n".join(chosen).replace("num_workers=2", "num_workers=0"))  # in-process: warnings count
    done = subprocess.run([sys.executable, "-W", "error::UserWarning", str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 0, done.stderr


def test_quiet_means_quiet_and_a_refusal_comes_before_any_note(tmp_path: Path, dataset: Path, capsys) -> None:
    """A job with few updates: ``memtrain.fit`` notes it in Python terms, not with ``--set``; ``quiet=True`` prints
    nothing at all; an existing run directory is refused before the note is shown."""
    few = {"data": {"path": str(dataset)}, "model": {"kind": "softmax"}, "train": {"epochs": 2, "workers": 0}}
    memtrain.fit(**few, run_dir=tmp_path / "quiet", quiet=True)
    assert capsys.readouterr() == ("", "")
    memtrain.fit(**few, run_dir=tmp_path / "loud")
    err = capsys.readouterr().err
    assert err.startswith("memtrain.fit: note: this job makes only 2 updates in all"), err
    assert "train={'batch_size': 16}" in err and "--set" not in err
    with pytest.raises(InputError, match="the run directory already exists"):
        memtrain.fit(**few, run_dir=tmp_path / "loud")
    assert "note:" not in capsys.readouterr().err


def test_a_cell_run_again_without_a_run_dir_trains_beside_the_earlier_run(tmp_path: Path, dataset: Path, capsys,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Without run_dir, the run goes to runs/default; a second fit goes to runs/default-2, said in Python terms."""
    monkeypatch.chdir(tmp_path)
    first = memtrain.fit(**sections(dataset), quiet=True)
    second = memtrain.fit(**sections(dataset))
    assert (first.run_dir, second.run_dir) == (tmp_path / "runs" / "default", tmp_path / "runs" / "default-2")
    err = capsys.readouterr().err
    assert f"`memtrain.fit(resume={str(first.run_dir)!r})`" in err and "overwrite=True" in err and "--" not in err
