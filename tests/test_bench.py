"""`memtrain bench train` at a tiny size: it runs every method and prints a well-formed table or JSON.

No timing assertions: the figures depend on the machine; only the shape of the report is checked (at this
size a repeat's 2E-epoch run may take no longer than its E-epoch run: its figure is then None, and says so).
How the figures are computed, and what makes the baselines fair, is pinned in test_bench_fairness.py.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import CliResult
from table_widths import assert_fits_or_whole, printed

from benchmarks import first_job_items
from memtrain.benchmarks.runner import METHODS, TORCH_METHODS
from memtrain.benchmarks.synthetic import mlp_shape
from memtrain.benchmarks.train_bench import placement

pytestmark = pytest.mark.timeout(240)


def bench(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memtrain", "bench", "train", "--sizes", "1e4", "--updates", "4",
                           "--warmup", "1", "--repeats", "1", "--dir", str(tmp_path), *args],
                          capture_output=True, text=True, timeout=230, env={**os.environ, **(env or {})})


# the one-off measurements in benchmarks/ (top folder of the repository) run with it on the path
SCRIPTS_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent.parent),
                                                                       os.environ.get("PYTHONPATH")]))}
TRAIN_COLUMNS = ("params", "epochs", "method", "samples/s", "ms/update (range)", "compute ms", "overhead ms",
                 "CPU ms/update", "start-up s", "peak MiB (range)", "peak PSS MiB (range)", "memtrain ÷ method (range)")
ASYNC_COLUMNS = ("params", "updates", "straggler", "mode", "updates/s, whole run", "÷ sync", "updates/s, steady",
                 "÷ sync, steady", "staleness mean", "staleness max", "recomputed")


def _timed(values: list[float | None]) -> list[float]:
    assert all(v is None or v > 0 for v in values)
    return [v for v in values if v is not None]


@pytest.fixture(scope="module")
def train_bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, list[str]]:
    """One `bench train --json` of every method (the numpy ones, memtrain_server, the torch ones) and the README's
    first command, for the three tests below: each reads its rows (the runs are what the figures come from; one
    run instead of three spares two benches' start-up and their common methods' runs). Returns the command's
    result and what it left in its --dir."""
    scratch = tmp_path_factory.mktemp("bench")
    methods = (*METHODS, "memtrain_server", *TORCH_METHODS)
    result = bench(scratch, "--json", "--methods", ",".join(methods))
    return result, os.listdir(scratch)


def test_json_report_has_every_method_with_sane_fields(train_bench: tuple[subprocess.CompletedProcess, list[str]],
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    result, left = train_bench
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    rows = report["results"]
    assert [row["method"] for row in rows] == [*METHODS, "memtrain_server", *TORCH_METHODS]
    for row in rows:
        if row["method"] not in METHODS:
            continue
        assert row["params"] == mlp_shape(10_000).params and row["epochs"] == [5, 10]  # small: E = 5
        assert row["extra_updates"] == 4 * 5 and row["peak_mib"] > 0
        assert 0 < row["pss_mib"] <= row["peak_mib"]
        assert row["compute_ms"] is not None and row["compute_ms"] > 0
        assert len(row["runs_samples_per_s"]) == 1
        assert row["untimed_repeats"] == len(row["runs_samples_per_s"]) - len(_timed(row["runs_samples_per_s"]))
        assert (row["samples_per_s"] is None) == (row["untimed_repeats"] == 1)
    memtrain = rows[0]
    assert memtrain["ratio_runs"] in ([], [1.0])
    assert any("exchange area" in line for line in memtrain["exchange"])
    assert all(any(line.startswith("rounds: ") for line in run) for run in memtrain["rounds"])
    (best,) = report["baselines"]
    assert best["best"] in ("one_process", "one_process_blas", "shared_memory", None)
    assert left == []  # datasets and runs are removed
    assert report["machine"]["cpus"] >= 1 and report["machine"]["cpu"] and report["machine"]["blas"] != "unknown"
    assert report["machine"]["memory_gib"] > 0
    from memtrain.benchmarks.train_bench import print_table

    assert_fits_or_whole(print_table, report, TRAIN_COLUMNS, capsys, monkeypatch)  # its table, from real figures


def test_torch_comparison_runs_ddp_and_takes_ratios_against_memtrain_with_the_torch_module(
        train_bench: tuple[subprocess.CompletedProcess, list[str]]) -> None:
    result, left = train_bench
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    rows = {row["method"]: row for row in report["results"] if row["method"] in TORCH_METHODS}
    assert list(rows) == list(TORCH_METHODS)
    base = rows["torch_memtrain"]["runs_samples_per_s"]
    for row in rows.values():
        assert row["params"] == mlp_shape(10_000).params
        assert 0 < row["pss_mib"] <= row["peak_mib"] and row["compute_ms"] > 0
        mine = row["runs_samples_per_s"]
        if base[0] is not None and mine[0] is not None:
            assert row["ratio_runs"] == [pytest.approx(base[0] / mine[0])]
        else:
            assert row["ratio"] is None and row["memtrain_ratio"] is None
    assert report["machine"]["torch"].startswith("2.13.0")
    assert left == []


def test_table_lists_every_method_and_the_first_command(train_bench: tuple[subprocess.CompletedProcess, list[str]],
                                                        capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """On an 80-column terminal (issue 44: the table was 240 columns, each row three lines): the table the command
    prints without --json (train_bench.run: ``print_table(report)``), of the shared run's report."""
    from memtrain.benchmarks.train_bench import print_table

    result, _ = train_bench
    assert result.returncode == 0, result.stderr
    table = printed(print_table, json.loads(result.stdout), 80, capsys, monkeypatch)
    assert max(map(len, table.splitlines())) <= 80, table
    text = " ".join(table.split())  # the title and the lines under the table wrap at 80 columns
    for header in ("samples/s", "ms/update (range)", "overhead ms", "CPU ms/update", "start-up s", "peak MiB",
                   "peak PSS MiB", "memtrain ÷ method (range)"):
        assert header in text
    assert "every method run E and 2E epochs" in text and "interleaved repeats" in text
    assert any(f"memtrain ({place}" in text for place in ("in the server", "on 2 workers", "placements"))
    assert ("memtrain, train.workers = 0 (in the server" in text  # its E and 2E runs may decide the
            or "memtrain, train.workers = 0 (placements differ)" in text)  # server's threads differently
    assert "one process, 1 thread" in text and "÷ best of one process" in text
    assert "numpy " in text and " CPUs (" in text and " GiB RAM" in text  # the machine
    assert "the README's first command" in text and "plain numpy loop" in text
    assert "memtrain train (" in text  # where its rounds ran
    assert "memtrain / plain loop, whole run, start-up included" in text
    assert "more epochs, start-up cancelled" in text
    # progress on stderr, not in the report: stderr is not a terminal here, so a line every 10 s at most
    assert result.stderr.startswith("bench train:   0.0% 10,360 params: memtrain (1 of 11)\n")
    assert not any(line.startswith("bench train:") for line in result.stdout.splitlines())


def test_the_placement_label_is_the_decision_not_a_figure_in_it() -> None:
    probe = "rounds: an update takes 238.51 ms in the server, 224.36 ms of it computing; starting 2 workers to compare"
    chosen = "rounds: on 2 workers from update 16: 154.68 ms per update on 2 workers, 238.51 ms in the server"
    kept = "rounds: in the server from update 7: an update takes 1.03 ms in the server, 0.24 ms of it computing"
    assert placement([probe, chosen]) == "on 2 workers"
    assert placement([probe, "rounds: in the server from update 20: 9.1 ms per update on 2 workers, 8.7 ms "
                                     "in the server; workers stopped"]) == "in the server"
    assert placement([kept]) == "in the server"
    assert placement(["rounds: on 2 worker processes (train.workers = 2)"]) == "on 2 workers"
    assert placement([probe]) == "undecided"
    threads = "rounds in the server: an update's tasks on 2 threads from update 14: 0.41 ms per update on 2 threads"
    one = "rounds in the server: an update's tasks on one thread from update 14: 0.9 ms per update on 2 threads"
    assert placement([threads, kept]) == "in the server, 2 threads"
    assert placement([one, kept]) == "in the server"
    assert placement([threads, probe, "rounds: on 2 workers from update 30: 1 ms"]) == "on 2 workers"
    alone = ("rounds: on 1 worker from update 7: an update takes 2.48 ms on 1 worker, 1.57 ms of it computing; 2 "
             "workers could save at most 0.301 s over the 383 updates left, less than starting the other 1 costs")
    assert placement(["rounds: timed on 1 worker process (train.workers = \"auto\")", alone]) == "on 1 worker"


def test_unknown_method_is_a_usage_error(tmp_path: Path, cli: Callable[..., CliResult]) -> None:
    result = cli("bench", "train", "--sizes", "1e4", "--dir", tmp_path, "--methods", "memtrain,mpi")
    assert result.code == 2
    assert "unknown --methods" in result.err and os.listdir(tmp_path) == []


def test_bench_async_runs_every_mode_with_and_without_a_straggler(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    result = subprocess.run([sys.executable, "-m", "memtrain", "bench", "async", "--sizes", "1e3", "--updates",
                             "6", "--warmup", "2", "--repeats", "1", "--dir", str(tmp_path), "--json"],
                            capture_output=True, text=True, timeout=230, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    rows = report["results"]
    assert [(r["straggler"], r["mode"]) for r in rows] == [(s, m) for s in (None, 3.0)
                                                           for m in ("sync", "staleness 1", "staleness 1, stream",
                                                                     "async")]
    for row in rows:
        assert row["updates_per_s"] > 0 and row["vs_sync"]["median"] > 0 and row["steady"]["median"] > 0
        assert len(row["vs_sync"]["runs"]) == 1 and row["updates"] == 6
        assert row["straggled"] == [row["straggler"] is not None], "every straggler run had its straggler"
    assert all(row["steady_updates"] == 6 - 2 for row in rows)  # the window given, not a small model's default
    staleness = {r["mode"]: r["staleness_max"] for r in rows[:4]}
    assert staleness["sync"] == 0 and staleness["staleness 1"] == staleness["staleness 1, stream"] == 1
    assert [c["check"] for c in report["checks"]] == ["async vs sync, with a straggler",
                                                      "staleness 1 vs sync, no straggler"]
    assert all(c["verdict"].endswith(("by median: met", "by median: NOT met")) for c in report["checks"])
    assert os.listdir(tmp_path) == []
    assert result.stderr.startswith("bench async:   0.0% 1,045 params: sync (1 of 8)\n")  # progress, not --json
    from memtrain.benchmarks.async_bench import print_table

    assert_fits_or_whole(print_table, report, ASYNC_COLUMNS, capsys, monkeypatch)


def test_bench_progress_names_each_run_and_counts_those_before_it(capsys: pytest.CaptureFixture[str]) -> None:
    from memtrain.progress import reporting

    with reporting("bench train", 4, plain_every=0.0, force_plain=True) as progress:
        for method in ("memtrain", "one process", "memtrain", "one process"):
            progress.begin(method)
    assert capsys.readouterr().err.splitlines() == [
        "bench train:   0.0% memtrain (1 of 4)", "bench train:  25.0% one process (2 of 4)",
        "bench train:  50.0% memtrain (3 of 4)", "bench train:  75.0% one process (4 of 4)"]


@pytest.mark.parametrize("columns", [80, 60])
def test_the_bench_bar_never_cuts_its_times(monkeypatch: pytest.MonkeyPatch, columns: int) -> None:
    """On a terminal the bar's line fits and shows its counts and times whole; the run's name gives way,
    cut in the middle (issue 44: the elapsed time was cut to "0:0…")."""
    import io

    from rich.console import Console

    import memtrain.progress

    screen = io.StringIO()
    monkeypatch.setattr(memtrain.progress, "console", lambda stderr=True: Console(
        file=screen, force_terminal=True, width=columns, color_system=None))
    monkeypatch.setattr(memtrain.progress, "may_be_a_terminal", lambda: True)
    with memtrain.progress.reporting("bench train", 24) as progress:
        progress.update(3, "10,360 params: memtrain, train.workers = N (in the server, 2 threads) (4 of 24)")
        line = io.StringIO()
        Console(file=line, width=columns, force_terminal=True, color_system=None).print(
            progress._progress.make_tasks_table(progress._progress.tasks))
    (shown,) = line.getvalue().splitlines()
    assert len(shown) <= columns and shown.startswith("bench train ")
    assert re.search(r" 3/24  12% .*\S 0:00:0\d -:--:--$", shown), shown
    assert "…" in shown and ("(4 of 24)" in shown or columns < 80)  # the end of the name: which of how many


def test_bench_async_measures_small_models_over_a_longer_window_unless_told() -> None:
    from memtrain.benchmarks.train_bench import SMALL_UPDATES, SMALL_WARMUP, UPDATES, WARMUP, window

    unset = argparse.Namespace(updates=None, warmup=None)
    assert window(unset, params=10_360) == (SMALL_UPDATES, SMALL_WARMUP) == (200, 20)
    assert window(unset, params=999_820) == window(unset, params=None) == (UPDATES, WARMUP) == (40, 3)
    assert window(argparse.Namespace(updates=6, warmup=None), params=10_360) == (6, SMALL_WARMUP)
    assert window(argparse.Namespace(updates=None, warmup=2), params=999_820) == (UPDATES, 2)


@pytest.mark.slow
def test_torch_contention_times_the_three_settings_and_the_gemm_backends() -> None:
    result = subprocess.run([sys.executable, "-m", "benchmarks.torch_contention", "--sizes", "1e4",
                             "--updates", "2"], capture_output=True, text=True, timeout=200, env=SCRIPTS_ENV)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    settings = [line for line in lines if "rows/s" in line]
    labels = ["1 process alone, 1 thread", "2 processes at once, 1 thread each", "1 process, 2 threads"]
    assert len(settings) == 3 and all(label in line for label, line in zip(labels, settings, strict=True))
    assert len(settings[1].split("ms/update")[1].split("cpu ms")[0].split()) == 2  # one time per process
    gemms = [line for line in lines if "GEMM" in line]
    assert len(gemms) >= 2 and all(float(line.split("best")[1].split()[0]) > 0 for line in gemms)


def test_the_first_command_decomposed_reaches_memtrain_s_own_weights_and_adds_up() -> None:
    """The loops of first_job_parts do memtrain's arithmetic (they end on the checksum of memtrain's last
    version), and memtrain's run splits into parts that add up to its time."""
    result = subprocess.run([sys.executable, "-m", "benchmarks.first_job_parts", "--repeats", "1"],
                            capture_output=True, text=True, timeout=230, env=SCRIPTS_ENV)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("the README's first command: 390 updates, 30 epochs")
    assert lines[-1].endswith("end on the weights of memtrain's last version (its lineage checksum): yes")

    def seconds(label: str) -> float:
        (line,) = [line for line in lines if line.strip().startswith(label)]
        return float(line.split(" s ")[0].split()[-1])

    for label in ("1. plain numpy loop", "2a. the job's 2 tasks", "2b. memtrain's step", "3. + each version a file",
                  "evaluation x 30", "checkpoint x 6"):
        assert seconds(label) > 0
    total = seconds("memtrain's own run")
    parts = [seconds(label) for label in ("start-up", "updates", "between epochs", "after the last update")]
    assert all(part > 0 for part in parts) and sum(parts) == pytest.approx(total, abs=5e-4)


def test_the_items_of_an_update_are_timed_in_cpu_and_fit_inside_the_server_s_cpu(tmp_path: Path) -> None:
    """first_job_items: every item of the server's rounds gets its CPU time per update, and the items are parts
    of the server's own CPU time (the rounds in all less than the whole, the model less than its task)."""
    from tiny_data import blobs, write_dataset

    x, y = blobs(n=300, features=6, classes=3, seed=1)
    data = write_dataset(tmp_path / "blobs", x, y)
    job = tmp_path / "job.toml"
    job.write_text(f'[data]\npath = "{data}"\n[model]\nkind = "mlp"\nhidden = [8]\n'
                   '[train]\nepochs = 2\nbatch_size = 30\ntasks_per_update = 2\nworkers = 0\n[run]\ndir = "run"\n')
    result = subprocess.run([sys.executable, "-m", "benchmarks.first_job_items", str(job), "--quiet"],
                            capture_output=True, text=True, timeout=120, env=SCRIPTS_ENV, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    head = [line for line in lines if "updates; the server's CPU" in line]
    assert head and head[0].startswith("18 updates")
    items = {line.rsplit("  ", 1)[0].strip(): float(line.split()[-4]) for line in lines if line.endswith("per update")
             and line.startswith("  ")}
    whole = float(head[0].split(": ")[1].split()[0])
    assert set(items) == {item for _, item in first_job_items.ITEMS}
    assert all(value > 0 for value in items.values())
    assert items["the model's loss and gradient"] < items["a gradient task (the model's included)"]
    assert items["the rounds, in all"] < whole


def test_the_zero_gradient_mlp_has_the_mlps_parameters_and_writes_a_gradient_of_zeros() -> None:
    """first_job_items.ZeroGradientMLP: memtrain's own work per update (the MLP's step, records and files) without
    the model's compute."""
    from memtrain.models.protocol import DataSpec
    from memtrain.models.registry import build_model

    spec = DataSpec(n_features=6, task="classification", n_classes=3)
    model = build_model("benchmarks.first_job_items:ZeroGradientMLP", {"hidden": [8]}, spec)
    assert model.parameter_shapes() == build_model("mlp", {"hidden": [8]}, spec).parameter_shapes()
    grads = {name: np.ones(shape, np.float32) for name, shape in model.parameter_shapes().items()}
    assert model.loss_and_grad({}, np.ones((4, 6), np.float32), np.zeros(4, np.int64), grads) == 1.0
    assert all(not grad.any() for grad in grads.values())


def test_a_memtrain_row_whose_runs_ended_in_different_places_says_so() -> None:
    """"auto" may decide differently in the E- and the 2E-epoch run (the 2E run has more updates left to pay
    for workers): the row's update cost then mixes two placements, and its label says so."""
    from memtrain.benchmarks.train_bench import summarize

    server = ["rounds: in the server from update 14: an update takes 28.05 ms in the server"]
    workers = ["rounds: an update takes 19.69 ms in the server; starting 2 workers to compare",
               "rounds: on 2 workers from update 47: 16.10 ms per update on 2 workers, 19.69 ms in the server"]

    def run(rounds: list[str]) -> dict:
        return {"compute_seconds": [0.01] * 4, "wall_seconds": 2.0, "peak_mib": 100.0, "pss_mib": 90.0,
                "rounds": rounds}

    def pair(short: list[str], long: list[str]) -> dict:
        return {"update_s": 0.02, "cpu_update_s": 0.03, "extra_updates": 40, "short": run(short), "long": run(long)}

    mixed = summarize("memtrain", [pair(server, workers), pair(server, server)], 0)
    assert mixed["placements"] == ["in the server", "on 2 workers"]
    assert mixed["label"] == "memtrain (placements differ)"
    alike = summarize("memtrain", [pair(workers, workers), pair(workers, workers)], 0)
    assert alike["label"] == "memtrain (on 2 workers)" and alike["placements"] == ["on 2 workers"]
    assert summarize("one_process", [pair([], [])], 0)["placements"] == []


def test_memory_is_the_median_of_the_repeats_peaks_with_their_range(capsys: pytest.CaptureFixture[str]) -> None:
    """Each repeat's peak is the larger of its two runs'; the row gives the median over the repeats and the
    range, as every other figure (one run's outlier is printed beside the median, not as the figure)."""
    from memtrain.benchmarks.train_bench import print_table, summarize

    def run(peak: float, pss: float) -> dict:
        return {"compute_seconds": [0.01] * 4, "wall_seconds": 2.0, "peak_mib": peak, "pss_mib": pss}

    def pair(short: tuple[float, float], long: tuple[float, float]) -> dict:
        return {"update_s": 0.02, "cpu_update_s": 0.03, "extra_updates": 40, "short": run(*short),
                "long": run(*long)}

    row = summarize("one_process", [pair((150, 90), (160, 100)), pair((170, 120), (140, 110)),
                                    pair((400, 300), (180, 80))], 0)
    assert (row["pss_mib"], row["pss_mib_range"]) == (120, [100, 300])
    assert (row["peak_mib"], row["peak_mib_range"]) == (170, [160, 400])
    row.update(params=10_360, epochs=[5, 10], ratio=None)
    report = {"settings": {"batch": 512, "workers": 2, "updates": 40, "repeats": 3},
              "machine": {"cpus": 2, "cpu": "test CPU", "memory_gib": 1.0, "blas": "test", "numpy": "2",
                          "python": "3.11", "loadavg_before": [0.5], "loadavg_after": [0.6]},
              "results": [row], "baselines": [], "first_job": None}
    print_table(report)
    printed = capsys.readouterr().out
    assert "120 (100-300)" in printed and "170 (160-400)" in printed


RUN_OPTIONS = {"--sizes", "--updates", "--warmup", "--workers", "--exchange", "--against", "--shuffle"}
OWN_OPTIONS = {"train": RUN_OPTIONS | {"--epochs", "--methods", "--first-job", "--cluster", "--costs", "--startup",
                                      "--larger-than-ram", "--limit-mib", "--data-factor", "--params"},
               "prepare": {"--gb", "--sources", "--settle"},
               "async": RUN_OPTIONS | {"--straggler", "--straggler-from"},
               "loader": {"--rows", "--features", "--batch", "--loader-workers", "--methods", "--larger-than-ram",
                          "--limit-mib", "--data-factor"},
               "rl": {"--env-steps", "--target", "--envs", "--sides"}}


@pytest.mark.parametrize("what", sorted(OWN_OPTIONS))
def test_each_bench_command_lists_only_its_own_options(what: str, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``memtrain bench WHAT --help`` names WHAT's options and none of the other benchmarks' (issue 7). Through the
    CLI's entry point in this process: argparse prints the help and exits 0."""
    from memtrain.cli import main

    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit) as exited:
        main(["bench", what, "--help"])
    out = capsys.readouterr().out
    assert exited.value.code == 0, out
    listed = {line.split()[0].rstrip(",") for line in out.splitlines()
              if line.startswith("  --") or line.startswith("  -h")}
    assert OWN_OPTIONS[what] <= listed, OWN_OPTIONS[what] - listed
    others = set().union(*(OWN_OPTIONS[other] for other in OWN_OPTIONS if other != what)) - OWN_OPTIONS[what]
    assert not listed & others, f"bench {what} --help lists other benchmarks' options: {sorted(listed & others)}"
    assert listed == OWN_OPTIONS[what] | {"-h", "--debug", "--dir", "--repeats", "--json"}
    assert f"memtrain bench {what} " in out  # its own examples


def test_a_bench_command_refuses_another_ones_option(tmp_path: Path) -> None:
    """An option of another benchmark is an error naming it, not silently ignored."""
    result = subprocess.run([sys.executable, "-m", "memtrain", "bench", "prepare", "--sizes", "1e4", "--dir",
                             str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "--sizes" in result.stderr and "Traceback" not in result.stderr
    assert os.listdir(tmp_path) == []
