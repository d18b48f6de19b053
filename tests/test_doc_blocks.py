"""Every code block of README.md and docs/*.md is executed or checked, so the prose cannot drift from the code.

- ``python`` blocks run, page by page in order, in a folder holding what the first README command makes
  (``data/digits`` and its run ``runs/digits-mlp``). A block that truly cannot run says why on the line
  before it: ``<!-- not executed: REASON -->``.
- ``toml`` blocks load as a job, or as a ``[model]`` table that builds a model.
- every ``memtrain`` command line (in ``bash``/``sh`` blocks and in plain listings) uses only options the
  command has; one without placeholders parses. The commands of docs/inspect.md run against the first
  command's run. (README's tour runs in tests/test_readme.py.)
- output shown in plain blocks is compared with real output where the page says what produced it: the
  first command's summary, the model option errors, the prepare input errors.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import shutil
import sys
import tomllib
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from memtrain.cli import COMMANDS, build_parser, main
from memtrain.config import job_from_dict
from memtrain.errors import InputError
from memtrain.models import build_model
from memtrain.models.protocol import DataSpec
from memtrain.rl.config import rl_job_from_dict

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"python", "toml", "bash", "sh", ""}
RUN_COMMANDS = {"inspect.md"}  # pages whose memtrain commands run against the first command's run
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", flags=re.S | re.M)  # tests/test_docs.py checks every fence
NOT_EXECUTED = re.compile(r"<!-- not executed: .{10,} -->\n$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    body: str
    opted_out: bool

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    return [Block(page, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2),
                  bool(NOT_EXECUTED.search(text[:m.start()]))) for m in FENCE.finditer(text)]


ALL = [block for page in PAGES for block in blocks(page)]


def memtrain_commands(body: str) -> list[str]:
    """``memtrain ...`` commands of a block (``$`` prompts, ``&&`` chains and ``#`` comments removed). In a
    transcript (a block with ``$`` prompts) only the prompted lines are commands: the rest is their output."""
    found = []
    lines = body.splitlines()
    if any(raw.startswith("$ ") for raw in lines):
        lines = [raw for raw in lines if raw.startswith("$ ")]
    for raw in lines:
        line = raw.strip().removeprefix("$ ")
        line = re.split(r"\s+#", line, maxsplit=1)[0]
        for part in line.split("&&"):
            words = part.split()
            if len(words) >= 2 and words[0] == "memtrain" and not words[1].endswith(":"):
                found.append(part.strip())
    return found


PLACEHOLDER = re.compile(r"^\[|\.\.\.|^[A-Z][A-Z_]*(\.[a-z0-9]+)?$")


def is_synopsis(argv: list[str]) -> bool:
    return any(PLACEHOLDER.search(word) for word in argv)


def known_options(command: str) -> set[str]:
    options: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            options.update(action.option_strings)
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    walk(sub)

    walk(build_parser(command))
    return options


def check_command(command: str, where: Block) -> list[str]:
    argv = shlex.split(command)[1:]
    name = next((word for word in argv if word in COMMANDS), None)
    assert name, f"{where}: `{command}` names no memtrain command"
    unknown = [word.split("=")[0] for word in argv if word.startswith("--")
               and word.split("=")[0] not in known_options(name)]
    assert not unknown, f"{where}: `{command}` uses options memtrain {name} does not have: {unknown}"
    if not is_synopsis(argv):
        stderr = io.StringIO()
        with contextlib.redirect_stderr(stderr):
            try:
                build_parser(name).parse_args(argv)
            except SystemExit:
                pytest.fail(f"{where}: `{command}` does not parse: {stderr.getvalue()}")
    return argv


def check_toml(block: Block, sandbox: Path) -> None:
    raw = tomllib.loads(block.body.replace("<cores>", "2").replace('"runs/<job file name>"', '"runs/x"'))
    if "env" in raw:  # a reinforcement-learning job (docs/rl.md): validated by its own parser
        rl_job_from_dict(raw, base=sandbox)
        return
    if "data" not in raw:
        raw = {"data": {"path": str(sandbox / "data" / "digits")}, **raw}
    job_from_dict(raw, base=sandbox)
    model = raw.get("model", {})
    options = {key: value for key, value in model.items() if key != "kind"}
    specs = [DataSpec(n_features=4, task="classification", n_classes=3), DataSpec(n_features=4, task="regression")]
    errors = []
    for spec in specs:
        try:
            build_model(model.get("kind", "mlp"), options, spec)
            return
        except InputError as exc:
            errors.append(str(exc))
    pytest.fail(f"{block}: the [model] table builds no model: {errors}")


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the README's first command makes, in a folder of its own, plus a plain .npy for inspect."""
    root = tmp_path_factory.mktemp("docs")
    (root / "data").mkdir()
    shutil.copy(ROOT / "data" / "digits.csv", root / "data" / "digits.csv")
    assert main(["prepare", str(root / "data" / "digits.csv"), str(root / "data" / "digits")]) == 0
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):  # epoch lines: stderr
        code = main(["train", str(ROOT / "jobs" / "examples" / "digits-mlp.toml"), "--workers", "2", "--set",
                     f'data.path="{root / "data" / "digits"}"', "--run-dir", str(root / "runs" / "digits-mlp")])
    assert code == 0
    (root / "first-command.out").write_text(printed.getvalue().replace(str(root) + "/", ""))
    (root / "some").mkdir()
    np.save(root / "some" / "array.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
    return root


def test_every_block_has_a_known_language() -> None:
    unknown = [f"{block} ```{block.language}" for block in ALL if block.language not in LANGUAGES]
    assert not unknown, f"blocks no test knows how to check (use python, toml, bash or a plain block): {unknown}"


@pytest.mark.parametrize("page", [page for page in PAGES if page.name != "README.md"], ids=lambda p: p.name)
def test_page_blocks(page: Path, sandbox: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(sandbox)
    monkeypatch.syspath_prepend(str(ROOT / "tests"))  # user_model_example, as docs/models.md says
    monkeypatch.syspath_prepend(str(ROOT / "jobs" / "examples"))  # nets, beside the jobs of docs/torch.md
    for block in blocks(page):
        if block.language == "python" and not block.opted_out:
            module = types.ModuleType(f"docs_block_{block.line}")  # a real module: dataclasses look it up
            monkeypatch.setitem(sys.modules, module.__name__, module)
            exec(compile(block.body, str(block), "exec"), module.__dict__)
        elif block.language == "toml":
            check_toml(block, sandbox)
        for command in memtrain_commands(block.body):
            argv = check_command(command, block)
            if page.name in RUN_COMMANDS and not is_synopsis(argv):
                code = main(argv)
                assert code == 0, f"{block}: `{command}` exited {code}: {capsys.readouterr().err}"


def test_inspect_help_examples_run_on_what_the_first_command_makes(sandbox: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`memtrain inspect --help` names data/digits and runs/digits-mlp (and their checkpoints), so that each
    example runs as shown after the README's first command."""
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    examples = [line.split("  #")[0].strip() for line in capsys.readouterr().out.splitlines()
                if line.strip().startswith("memtrain inspect ")]
    assert len(examples) >= 10
    for name in ("data", "runs"):  # a folder of its own: the examples write loss.png, params.npz, ...
        shutil.copytree(sandbox / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    for command in examples:
        code = main(shlex.split(command)[1:])
        assert code == 0, f"`{command}` exited {code}: {capsys.readouterr().err}"


def test_readme_commands_use_real_options() -> None:
    for block in blocks(ROOT / "README.md"):
        for command in memtrain_commands(block.body):
            check_command(command, block)


def skeleton(line: str) -> str:
    return re.sub(r"\d[\d,.]*", "#", line.replace(".../", "")).strip()


def test_the_first_commands_summary_is_what_train_prints(sandbox: Path) -> None:
    shown = next(block for block in blocks(ROOT / "README.md") if block.body.startswith("epoch 30/30"))
    real = {skeleton(line) for line in (sandbox / "first-command.out").read_text().splitlines()}
    missing = [line for line in shown.body.splitlines() if skeleton(line) not in real]
    assert not missing, f"README shows lines `memtrain train` does not print: {missing}"


def test_model_option_errors_are_the_real_messages() -> None:
    shown = next(block for block in blocks(ROOT / "docs" / "models.md") if "has no option" in block.body)
    cls3 = DataSpec(n_features=4, task="classification", n_classes=3)
    real = []
    for kind, options in (("mlp", {"hiden": [64]}), ("mlp", {"activation": "sigmoid"}), ("logistic", {})):
        with pytest.raises(InputError) as caught:
            build_model(kind, options, cls3)
        real.append(str(caught.value))
    assert shown.body.splitlines() == real


def test_prepare_errors_are_the_real_messages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    shown = next(block for block in blocks(ROOT / "docs" / "prepare.md") if "ragged row" in block.body)
    sources = {"ragged": "f0,f1,label\n1,2,0\n3,0\n", "inf": "f0,f1,label\n1,2,0\n3,4,1\n5,inf,0\n"}
    real = []
    for name, text in sources.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "bad.csv").write_text(text)
        monkeypatch.chdir(tmp_path / name)
        assert main(["prepare", "bad.csv", "out"]) == 2
        real.append(capsys.readouterr().err.strip())
    assert shown.body.splitlines() == real
