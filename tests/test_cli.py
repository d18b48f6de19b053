"""The command line as a person sees it: a clean terminal, --quiet, --version, relative paths that mean one
thing, and error text without leftovers."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_data import blobs, write_dataset

from memtrain import __version__
from memtrain.errors import InputError
from memtrain.prepare.options import parse_synthetic

pytestmark = pytest.mark.timeout(120)
ROOT = Path(__file__).resolve().parent.parent

JOB = """
[data]
path = "{data}"

[model]
kind = "softmax"

[train]
epochs = {epochs}
batch_size = 100
workers = 2
"""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1000, features=6, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=300)


def job_file(folder: Path, data: Path | str, epochs: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(JOB.format(data=data, epochs=epochs))
    return folder / "job.toml"


def screen(raw: bytes) -> list[str]:
    """What a terminal shows after ``raw``: a minimal emulator of the controls rich's live display uses
    (carriage return, newline, cursor up ``ESC[nA``, erase line ``ESC[2K``; colours and cursor visibility
    ignored)."""
    lines, row, col = [""], 0, 0
    for token in re.findall(r"\x1b\[[0-9;?]*[A-Za-z]|\r|\n|[^\x1b\r\n]+", raw.decode()):
        if token == "\r":
            col = 0
        elif token == "\n":
            row += 1
            lines.extend([""] * (row + 1 - len(lines)))
        elif token.startswith("\x1b["):
            if token.endswith("A"):
                row = max(0, row - int(token[2:-1] or 1))
            elif token == "\x1b[2K":
                lines[row] = ""
        else:
            line = lines[row].ljust(col)
            lines[row] = line[:col] + token + line[col + len(token):]
            col += len(token)
    return [line.rstrip() for line in lines if line.strip()]


def run_in_terminal(argv: list[str], cwd: Path) -> list[str]:
    """Run ``memtrain ARGV`` with a pseudo-terminal as stdout and stderr; the final screen."""
    return screen(terminal_output(argv, cwd))


def terminal_output(argv: list[str], cwd: Path) -> bytes:
    """Run ``memtrain ARGV`` with a pseudo-terminal as stdout and stderr; every byte it wrote there."""
    leader, follower = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "TERM": "xterm"}
    process = subprocess.Popen([sys.executable, "-m", "memtrain", *argv], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                               stdout=follower, stderr=follower)
    os.close(follower)
    raw = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the other side closed
            break
        if not chunk:
            break
        raw += chunk
    os.close(leader)
    assert process.wait(timeout=60) == 0, raw.decode(errors="replace")
    return raw


def test_progress_bars_leave_no_trace_on_a_terminal(tmp_path: Path, dataset: Path) -> None:
    job = job_file(tmp_path, dataset, epochs=3)
    shown = run_in_terminal(["train", str(job), "--set", "train.batch_size=25"], tmp_path)  # 108 updates: no note
    assert [line.split("  ")[0] for line in shown[:3]] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    assert shown[3].startswith("done: 3 epochs, weight version 108")
    assert len(shown) == 8, shown  # 3 epoch lines and the 5 summary lines: no bar left behind
    assert not any("━" in line or "%" in line for line in shown), shown
    shown = run_in_terminal(["prepare", "--synthetic", "2e3x4", str(tmp_path / "synthetic")], tmp_path)
    assert shown[0] == f"prepared {tmp_path / 'synthetic'}" and not any("━" in line for line in shown), shown


def test_the_bar_is_drawn_on_a_terminal_and_off_one_rich_is_never_imported(tmp_path: Path, dataset: Path) -> None:
    """Off a terminal (stderr a pipe or a log: a run's own processes, a service's, the tests' commands) the plain
    lines need no rich, and its import (40 ms of CPU a process) is left out; on a terminal, or where FORCE_COLOR
    says the pipe is one, rich draws the bar."""
    job = job_file(tmp_path, dataset, epochs=3)
    assert "━".encode() in terminal_output(["train", str(job), "--run-dir", tmp_path / "tty"], tmp_path)
    code = ("import sys; from memtrain.cli import main; code = main(['train', sys.argv[1], '--run-dir', sys.argv[2]]); "
            "print(code, any(name.split('.')[0] == 'rich' for name in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    for name, extra, rich in (("pipe", {}, False), ("forced", {"FORCE_COLOR": "1"}, True)):
        done = subprocess.run([sys.executable, "-c", code, str(job), str(tmp_path / name)], capture_output=True,
                              text=True, timeout=60, env={**env, "PYTHONPATH": str(ROOT), **extra}, cwd=tmp_path)
        assert done.stdout.splitlines()[-1].split() == ["0", str(rich)], done.stderr
        assert ("━" in done.stderr) == rich and "epoch 3/3" in done.stderr, done.stderr


def test_quiet_prints_no_progress_and_no_epoch_lines(tmp_path: Path, dataset: Path, cli) -> None:
    job = job_file(tmp_path, dataset)
    enough = ("--set", "train.batch_size=16")  # 114 updates: no few-updates note (which --quiet leaves out too)
    loud = cli("train", job, *enough, "--run-dir", tmp_path / "loud")
    assert loud.code == 0 and "epoch 2/2" in loud.err
    quiet = cli("train", job, *enough, "--quiet", "--run-dir", tmp_path / "quiet")
    assert quiet.code == 0 and quiet.err == ""
    assert quiet.out.startswith("done: 2 epochs")
    prepared = cli("prepare", "--synthetic", "1e3x4", tmp_path / "ds", "-q")
    assert prepared.code == 0 and prepared.err == "" and "rows     1,000" in prepared.out


def test_version(capsys) -> None:
    from memtrain.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"memtrain {__version__}\n"


def test_paths_in_a_job_file_are_relative_to_it_and_paths_on_the_command_line_to_the_cwd(
        tmp_path: Path, dataset: Path, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "blobs").symlink_to(dataset)
    job = job_file(tmp_path / "jobs" / "examples", "../../data/blobs")
    job.write_text(job.read_text() + '\n[run]\ndir = "../../runs/from-file"\nexchange = "xch"\n')
    (job.parent / "xch").mkdir()  # an exchange directory must exist: memtrain never creates one
    monkeypatch.chdir(tmp_path)
    assert cli("train", job).code == 0
    assert (tmp_path / "runs" / "from-file" / "checkpoints").is_dir()
    assert f"exchange area: {tmp_path / 'jobs' / 'examples' / 'xch'}/" in \
        (tmp_path / "runs" / "from-file" / "events.log").read_text()
    # on the command line: relative to where the command runs (not to jobs/examples/)
    done = cli("train", job, "--set", "data.path=data/blobs", "--set", 'run.dir="runs/from-set"')
    assert done.code == 0, done.err
    assert (tmp_path / "runs" / "from-set" / "checkpoints").is_dir()
    done = cli("train", job, "--set", "data.path=data/blobs", "--run-dir", "runs/from-option")
    assert done.code == 0 and (tmp_path / "runs" / "from-option" / "checkpoints").is_dir()
    done = cli("train", "--resume", "runs/from-option", "--set", "train.epochs=3", "--set", "data.path=data/blobs")
    assert done.code == 0 and "done: 3 epochs" in done.out
    missing = cli("train", job, "--set", "data.path=data/nope")
    assert missing.code == 2 and f"{tmp_path / 'data' / 'nope'}: dataset directory not found" in missing.err


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "train.epocs=3"], "unknown key train.epocs (expected one of "),
    (["--set", "run.keep_checkpoint=3"], "unknown key run.keep_checkpoint (expected one of "),
    (["--set", "trian.epochs=3"], "unknown section [trian] (expected one of [data], [model], [train], [run])"),
])
def test_unknown_keys_say_what_was_meant(tmp_path: Path, dataset: Path, cli, args: list[str], message: str) -> None:
    job = job_file(tmp_path, dataset)
    done = cli("train", job, *args)
    assert done.code == 2
    assert message in done.err
    meant = {"train.epocs=3": "epochs", "run.keep_checkpoint=3": "keep_checkpoints", "trian.epochs=3": "train"}
    assert done.err.rstrip().endswith(f"). did you mean `{meant[args[1]]}`?"), done.err
    assert "None" not in done.err


def test_far_misses_get_no_guess_and_no_none(tmp_path: Path, dataset: Path, cli) -> None:
    done = cli("train", job_file(tmp_path, dataset), "--set", "train.zzz=1")
    assert done.code == 2 and "did you mean" not in done.err and "None" not in done.err
    workers = cli("train", job_file(tmp_path, dataset), "--workers", "-1")
    assert workers.code == 2
    assert workers.err == "memtrain train: error: --workers must be 0 (the server trains alone) or more (found -1)\n"


def test_counts_are_singular_for_one(tmp_path: Path, dataset: Path, cli) -> None:
    done = cli("train", job_file(tmp_path, dataset, epochs=1))
    assert done.code == 0 and done.out.startswith("done: 1 epoch, weight version 9,")
    x, y = blobs(n=20, features=3, classes=2)
    small = write_dataset(tmp_path / "small", x, y, val_rows=2, shard_rows=400)
    shown = cli("inspect", small)
    assert "train 18 rows in 1 shard, val 2 rows in 1 shard" in shown.out, shown.out


@pytest.mark.parametrize("kind", ["ridge", "naive_bayes"])
def test_an_additive_run_reports_its_one_pass_not_epochs(tmp_path: Path, dataset: Path, cli,
                                                         monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    """However many epochs the job says, an additive model is one pass of statistics and a solve."""
    job = job_file(tmp_path, dataset, epochs=3)
    job.write_text(job.read_text().replace('kind = "softmax"', f'kind = "{kind}"'))
    done = cli("train", job, "--workers", "0")
    assert done.code == 0, done.err
    assert done.out.startswith("done: one pass of statistics, then a solve, weight version 1, ")
    assert done.out.splitlines()[1].startswith("result: val_loss ") and "epoch" not in done.out
    assert "train.epochs = 3" in done.err and "do not apply and are ignored" in done.err  # the job's keys, named
    run = tmp_path / "runs" / "job"
    assert "done: one pass of statistics, then a solve, weight version 1" in (run / "events.log").read_text()
    monkeypatch.setenv("COLUMNS", "80")
    shown = cli("inspect", run).out.split("\n\n")[0]  # the lines above the tables
    assert "training: one pass of statistics, then a solve, 0 workers, seed 0" in shown
    assert "progress: done, newest version 1" in shown and "result: val_loss " in shown
    assert "epoch" not in shown and "optimizer" not in shown


def test_prepare_usage_and_behaviour_agree(tmp_path: Path, cli, capsys) -> None:
    from memtrain.cli import build_parser

    usage = build_parser("prepare").parse_args(["prepare", "a", "b"])
    assert (usage.source, usage.out) == (Path("a"), Path("b"))
    help_text = build_parser("prepare")._subparsers._group_actions[0].choices["prepare"].format_usage()
    assert help_text.rstrip().endswith("[SOURCE] OUT") and "..." not in help_text
    with pytest.raises(SystemExit) as refused:  # no second pair: the usage line does not promise one
        cli("prepare", "a.csv", "a", "b.csv", "b")
    assert refused.value.code == 2 and "unrecognized arguments: b.csv b" in capsys.readouterr().err
    assert cli("prepare", "only").code == 2
    both = cli("prepare", "--synthetic", "100x4", "src.npy", tmp_path / "out")
    assert both.code == 2 and "give a SOURCE file and OUT, or --synthetic ROWSxFEATURES and OUT" in both.err


@pytest.mark.parametrize(("spec", "shape"), [
    ("1e6x4", (1_000_000, 4)), ("2.5e3x8", (2500, 8)), ("1E3X2", (1000, 2)), ("1_000x3", (1000, 3)),
    ("1,000x3", (1000, 3)), ("100000x64", (100000, 64))])
def test_synthetic_sizes_may_use_scientific_notation(spec: str, shape: tuple[int, int]) -> None:
    assert parse_synthetic(spec) == shape


@pytest.mark.parametrize("spec", ["1.5x4", "0x4", "10x0", "1e-3x4", "x4", "10", "tenx4", "infx4", "nanx4"])
def test_synthetic_sizes_that_are_not_whole_positive_counts_are_refused(spec: str) -> None:
    with pytest.raises(InputError, match="--synthetic needs ROWSxFEATURES"):
        parse_synthetic(spec)


def test_synthetic_in_scientific_notation_through_the_cli(tmp_path: Path, cli) -> None:
    done = cli("prepare", "--synthetic", "1e3x4", tmp_path / "ds", "--quiet")
    assert done.code == 0 and "rows     1,000 (train 900, val 100)" in done.out


def test_the_command_ends_with_its_output_and_exit_code_but_without_the_teardown(tmp_path: Path,
                                                                                 dataset: Path) -> None:
    """`memtrain` runs the atexit hooks, flushes what it printed to a pipe and keeps its exit code, but skips
    the interpreter's teardown (memtrain/cli.py ``console``): 58-91 ms of every command."""
    marks = tmp_path / "marks"
    marks.mkdir()
    job = job_file(tmp_path / "job", dataset)
    job.write_text(job.read_text().replace('"softmax"', '"exit_models:MarksItsExit"').replace("workers = 2",
                                                                                              "workers = 0"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
           "MEMTRAIN_TEST_EXIT_MARKS": str(marks)}
    done = subprocess.run([sys.executable, "-m", "memtrain", "train", str(job), "--quiet"], capture_output=True,
                          text=True, env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().splitlines()[-1].startswith("inspect it with: memtrain inspect"), done.stdout
    assert [path.name.split("-")[0] for path in marks.iterdir()] == ["atexit"]
    failed = subprocess.run([sys.executable, "-m", "memtrain", "train", str(tmp_path / "missing.toml")],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert failed.returncode == 2 and "missing.toml" in failed.stderr
