"""Every example job in jobs/examples/ runs (one short epoch, on data prepared by the CLI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memtrain.cli import main

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent
# the reinforcement-learning examples (an [env], no [data]) are checked by tests/test_rl_config.py until
# memtrain train runs them
EXAMPLES = sorted(job for job in (ROOT / "jobs" / "examples").glob("*.toml") if "[env]" not in job.read_text())


@pytest.fixture(scope="module")
def datasets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("example-data")
    made = {"digits": root / "digits", "synthetic-binary": root / "binary", "synthetic-regression": root / "reg"}
    assert main(["prepare", str(ROOT / "data" / "digits.csv"), str(made["digits"])]) == 0
    assert main(["prepare", "--synthetic", "3000x10", str(made["synthetic-binary"]), "--classes", "2"]) == 0
    assert main(["prepare", "--synthetic", "3000x10", str(made["synthetic-regression"]), "--task", "regression"]) == 0
    return made


def test_there_is_an_example_for_every_builtin_model() -> None:
    from memtrain.models import MODEL_KINDS

    kinds = {line.split("=")[1].strip().strip('"') for job in EXAMPLES for line in job.read_text().splitlines()
             if line.startswith("kind")}
    assert kinds == set(MODEL_KINDS)


@pytest.mark.parametrize("job", EXAMPLES, ids=[job.stem for job in EXAMPLES])
def test_example_job_trains(job: Path, datasets: dict[str, Path], tmp_path: Path, capsys) -> None:
    data = next(path for name, path in datasets.items() if f'data/{name}"' in job.read_text())
    # one worker process: the job runs across the process boundary as every job does; how the bits stay the
    # same on 2 and 4 is test_goldens.py's (sync-2, torch-sync, ridge, naive-bayes on 2 workers)
    code = main(["train", str(job), "--set", f'data.path="{data}"', "--set", "train.epochs=1",
                 "--run-dir", str(tmp_path / "run"), "--workers", "1"])
    assert code == 0, capsys.readouterr().err
    assert "val_loss" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_digits_cnn_reaches_97_percent_validation_accuracy(datasets: dict[str, Path], tmp_path: Path,
                                                           capsys) -> None:
    """The documented claim for jobs/examples/digits-cnn.toml, with its own settings (20 epochs)."""
    import json

    code = main(["train", str(ROOT / "jobs" / "examples" / "digits-cnn.toml"), "--set",
                 f'data.path="{datasets["digits"]}"', "--run-dir", str(tmp_path / "run"), "--workers", "2"])
    assert code == 0, capsys.readouterr().err
    epochs = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
              if json.loads(line)["kind"] == "epoch"]
    assert len(epochs) == 20 and epochs[-1]["val_accuracy"] >= 0.97
