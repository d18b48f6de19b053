"""The README's commands and the docs' job reference are checked, so the prose cannot drift from the code."""

from __future__ import annotations

import dataclasses
import re
import shlex
import sys
import tomllib
import types
from pathlib import Path

import pytest

from memtrain.cli import main
from memtrain.config import DataConfig, RunConfig, TrainConfig, job_from_dict
from memtrain.train.optim import OptimizerConfig

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def code_blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def test_ci_runs_exactly_the_readme_test_command() -> None:
    commands = [line for line in code_blocks("bash")[0].splitlines() if line and not line.startswith("#")]
    assert len(commands) == 2, "the first block holds the two commands of a fresh machine"
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    ci = [line for line in lines if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [commands[1]]


def test_the_main_command_names_files_that_exist() -> None:
    main = code_blocks("bash")[0].splitlines()[1]
    for path in re.findall(r"(?:data|jobs)/[\w./-]+\.(?:csv|toml)", main):
        assert (ROOT / path).exists(), path


def test_the_job_reference_lists_every_key_with_its_real_default() -> None:
    train_page = (ROOT / "docs" / "train.md").read_text()
    block = next(b for b in code_blocks("toml", train_page) if b.startswith("[data]") and "exchange" in b)
    raw = tomllib.loads(block.replace('"runs/<job file name>"', '"runs/x"'))
    job = job_from_dict(raw, base=ROOT)
    defaults = {f.name: f for cls in (DataConfig, RunConfig) for f in dataclasses.fields(cls)}
    for section in ("data", "run"):
        for key, value in raw[section].items():
            field = defaults[key]
            if key not in ("path", "dir"):
                default = list(field.default) if isinstance(field.default, tuple) else field.default  # TOML array
                assert value == default, f"docs say {section}.{key} = {value}, code says {field.default}"
    for field in dataclasses.fields(TrainConfig):
        if field.name not in ("optimizer", "batch_size", "patience", "max_staleness", "async_group"):  # None
            assert field.name in raw["train"], f"train.{field.name} missing from docs/train.md"
            assert raw["train"][field.name] == field.default, field.name
    assert raw["train"]["optimizer"] == OptimizerConfig.name and raw["train"]["lr"] == OptimizerConfig.lr
    assert job.train.workers == "auto"
    for key in ("batch_size", "patience", "max_staleness", "async_group"):
        assert f"# {key} = " in block, key  # shown commented out


def test_the_tour_job_leaves_workers_to_its_default() -> None:
    """A first job shows the defaults a user should keep: train.workers = "auto" decides at start."""
    tour = README.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    job = tomllib.loads(next(b for b in code_blocks("toml", tour) if b.startswith("# penguins.toml")))
    assert "workers" not in job["train"]


@pytest.mark.timeout(180)
def test_the_tour_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """The five-minute tour, block by block in an empty folder: python runs, a toml block whose first line
    is `# NAME.toml` becomes that file, every memtrain command exits 0, and what a print is said to show
    (`print(...)  # [...]`, or a model's `# TrainedModel(...)`: the best epoch's) is what it prints."""
    tour = README.split("## A five-minute tour", 1)[1].split("\n## ", 1)[0]
    monkeypatch.chdir(tmp_path)
    ran = []
    for language, body in re.findall(r"^```(\w*)\n(.*?)^```", tour, flags=re.S | re.M):
        if language == "python":
            module = types.ModuleType("readme_tour")
            monkeypatch.setitem(sys.modules, module.__name__, module)
            exec(compile(body, "README.md (tour)", "exec"), module.__dict__)
            out = capsys.readouterr().out
            for shown in re.findall(r"^print\(.*\)\s+# (\[.*\]|TrainedModel\(.*\))$", body, flags=re.M):
                assert shown in out, f"the tour says {shown}, the code printed {out}"
        elif language == "toml":
            name = re.fullmatch(r"# (\S+\.toml)", body.splitlines()[0])
            assert name, "a job file block of the tour starts with its file name"
            Path(name.group(1)).write_text(body)
        elif language == "bash":
            for command in filter(None, body.splitlines()):
                code = main(shlex.split(command)[1:])
                assert code == 0, f"`{command}` exited {code}: {capsys.readouterr().err}"
        ran.append(language)
    assert ran == ["python", "bash", "toml", "bash", "bash", "python"]
