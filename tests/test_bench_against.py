"""One bench run, three questions side by side (issue 27, issue 26's speed check): `bench train --shuffle rows,batches`
(both orders as memtrain methods, the update time of rows over batches per size), `--against PATH` (memtrain of
another checkout, the same job, its processes importing memtrain from PATH) and the larger-than-RAM scenario in
both orders. Pinned here without timing anything, except one real run of another checkout's memtrain.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from table_widths import assert_fits_or_whole
from test_bench_fairness import _fake_runs

import memtrain
from memtrain.benchmarks import checkout_run, train_bench
from memtrain.benchmarks.memtrain_run import spec_for
from memtrain.benchmarks.problem import Problem
from memtrain.errors import InputError
from memtrain.progress import Silent

pytestmark = pytest.mark.timeout(120)
ARGS = dict(updates=40, warmup=3, epochs=1, repeats=2, workers=2, exchange="auto", cluster="")


def other(tmp_path: Path) -> train_bench.Checkout:
    return train_bench.Checkout(root=tmp_path / "old", commit="abc1234")


def test_both_orders_and_another_checkout_run_interleaved_in_one_table(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    # per update: rows 2.08 ms, batches 2.0 ms here, 1.9 ms at the other checkout
    seen: list[tuple] = []
    _fake_runs(monkeypatch, {"memtrain": 1.0, "memtrain[batches]": 1.0, "memtrain@abc1234": 1.0},
               {"memtrain": 0.00208, "memtrain[batches]": 0.002, "memtrain@abc1234": 0.0019}, seen)
    shuffles, checkouts = ["rows", "batches"], [other(tmp_path)]
    methods = train_bench.with_orders(["memtrain"], shuffles, checkouts)
    assert methods == ["memtrain", "memtrain[batches]", "memtrain@abc1234"]
    rows = train_bench.bench_size(int(1e6), methods, argparse.Namespace(**ARGS), tmp_path, Silent(),
                                  shuffles=shuffles, checkouts=checkouts)
    # interleaved, each in its order; only the other checkout's runs are given the checkout
    assert [(m, s, c is not None) for m, s, c in seen] == 2 * [
        ("memtrain", "rows", False), ("memtrain", "rows", False), ("memtrain[batches]", "batches", False),
        ("memtrain[batches]", "batches", False), ("memtrain@abc1234", "batches", True),
        ("memtrain@abc1234", "batches", True)]
    assert [row["label"].split(" (")[0] for row in rows] == ["memtrain, rows order", "memtrain, batches order",
                                                               "memtrain@abc1234"]
    (order,) = train_bench.order_ratios(rows, shuffles)
    assert order["ratio"]["runs"] == pytest.approx([1.04, 1.04])
    assert order["verdict"] == "memtrain: update time, rows / batches order: 1.04x (runs 1.04-1.04), target <= " \
                               "1.05x by median: met"
    (against,) = train_bench.against_ratios(rows, shuffles, checkouts)
    assert against["name"] == "update time, memtrain[batches] / memtrain@abc1234 (the same job)"
    assert against["ratio"]["runs"] == pytest.approx([0.002 / 0.0019] * 2)


def test_one_order_keeps_the_plain_names_and_batches_is_the_reference() -> None:
    assert train_bench.with_orders(["memtrain", "one_process"], ["batches"], []) == ["memtrain", "one_process"]
    assert train_bench.with_orders(["memtrain", "one_process", "memtrain_server"], ["batches", "rows"], []) == [
        "memtrain", "memtrain[rows]", "one_process", "memtrain_server", "memtrain_server[rows]"]
    assert train_bench.with_orders(["one_process"], ["rows"], [other(Path("/x"))]) == [
        "one_process", "memtrain[batches]", "memtrain@abc1234"]
    assert train_bench.order_reference(["rows", "none"]) == "none"
    assert train_bench.method_parts("torch_memtrain[rows]") == ("torch_memtrain", "rows")
    assert train_bench.family("torch_memtrain[rows]") == "torch"


def test_bad_options_are_usage_errors(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "memtrain", "bench", "train", "--shuffle", "rows,sorted"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "unknown --shuffle" in result.stderr and "Traceback" not in result.stderr
    (tmp_path / "plain" / "memtrain").mkdir(parents=True)
    (tmp_path / "plain" / "memtrain" / "__init__.py").write_text("")
    this = Path(memtrain.__file__).resolve().parent.parent
    for against, message in [(tmp_path / "nothing", "--against needs a memtrain checkout"),
                             (tmp_path / "plain", "--against needs a git checkout"),
                             (this, "--against names this checkout itself")]:
        with pytest.raises(InputError, match=message):
            train_bench.other_checkout(against)
    subprocess.run(["git", "init", "-q", str(tmp_path / "plain")], check=True)
    subprocess.run(["git", "-C", str(tmp_path / "plain"), "-c", "user.name=t", "-c", "user.email=t@t", "commit",
                    "-q", "--allow-empty", "-m", "x"], check=True)
    args = argparse.Namespace(sizes="1e4", methods="memtrain", cluster="", shuffle="rows",
                              against=[str(tmp_path / "plain")], larger_than_ram=True)
    with pytest.raises(InputError, match="--against compares the table's runs"):
        train_bench.run(args)


def test_bench_async_refuses_another_order() -> None:
    args = argparse.Namespace(sizes="1e3", updates=None, warmup=None, straggler=3.0, workers=2, repeats=1,
                              shuffle="rows", against=[], dir=None)
    from memtrain.benchmarks import async_bench

    with pytest.raises(InputError, match="bench async runs the batches order"):
        async_bench.run(args)


def test_a_key_the_other_memtrain_lacks_is_left_out_only_where_it_changes_nothing() -> None:
    assert checkout_run.train_keys({"epochs"}, {"epochs": 2}, {"shuffle": "batches"}) == {"epochs": 2}
    assert checkout_run.train_keys({"epochs", "shuffle"}, {}, {"shuffle": "batches"}) == {"shuffle": "batches"}
    with pytest.raises(checkout_run.UnknownKey, match="no train.shuffle"):
        checkout_run.train_keys({"epochs"}, {"shuffle": "rows"}, {})
    problem = Problem("data", 4, 6, shuffle="rows")
    with pytest.raises(ValueError, match="batches order"):
        spec_for(problem, Path("run"), portable=True)


def test_against_runs_the_other_checkout_s_memtrain(tmp_path: Path) -> None:
    """A real run of checkout_run.py with another checkout on PYTHONPATH: a copy of this one in a git repo of its
    own. The run imports memtrain from the copy (checked by the harness), and a key the copy does not know
    (made up here) fails the run instead of being dropped."""
    from memtrain.benchmarks.synthetic import write_dataset

    copy = tmp_path / "old"
    checkout = copied_checkout(copy)
    assert checkout.method.startswith("memtrain@") and len(checkout.commit) >= 7
    data = write_dataset(tmp_path / "data", 4 * 16, 16, features=8, classes=3)
    problem = Problem(str(data), 4, 4, workers=2, batch=16, epochs=1)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = dict(os.environ)
    spec = spec_for(problem, scratch / "run", workers=0, portable=True)
    result, _, _ = train_bench.run_checkout(checkout, spec, scratch, what="the copy", env=env)
    assert Path(result["memtrain_file"]).resolve() == (copy / "memtrain" / "__init__.py").resolve()
    assert [r["update"] for r in result["records"]] == [1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="imported memtrain from"):
        checkout_run.check_imported(result, Path(memtrain.__file__).parent, "this checkout")
    spec["train"] = {"no_such_key": 1}
    with pytest.raises(Exception, match="has no train.no_such_key"):
        train_bench.run_checkout(checkout, spec, scratch, what="the copy", env=env)
    assert json.loads(json.dumps(spec))  # the spec is plain JSON


def test_the_larger_than_ram_scenario_runs_both_orders_side_by_side(monkeypatch: pytest.MonkeyPatch,
                                                                     tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from memtrain.benchmarks import larger_than_ram

    calls: list[tuple[str, str]] = []

    def fake_run_once(method: str, problem: Problem, scratch: Path, exchange: str, data_limit: int | None = None,
                      **_: Any) -> dict[str, Any]:
        calls.append((method, problem.shuffle))
        seconds = 0.004 if problem.shuffle == "rows" else 0.002
        return {"update_seconds": [seconds] * 9, "processes": [{"pid": 1, "name": "python", "peak_rss_mib": 300.0,
                                                                "peak_anon_mib": 30.0},
                                                               {"pid": 4194304, "name": "memtrain-worker",
                                                                "peak_rss_mib": 1234.5, "peak_anon_mib": 45.5}]}

    monkeypatch.setattr(train_bench, "run_once", fake_run_once)
    monkeypatch.setattr(larger_than_ram, "write_dataset", lambda path, *args, **kwargs: tmp_path)
    monkeypatch.setattr(larger_than_ram.os, "sync", lambda: None)
    args = argparse.Namespace(limit_mib=64, data_factor=2.0, params="1e4", workers=2, exchange="auto", repeats=2)
    report = larger_than_ram.run_scenario(args, tmp_path, ["rows", "batches"])
    assert calls == 2 * [("memtrain", "rows"), ("memtrain[batches]", "batches")]
    rows, batches = report["orders"]
    assert rows["verdict"] == "larger than RAM: update time, rows / batches order: 2.00x (runs 2.00-2.00), " \
                              "target <= 1.05x by median: NOT met"
    assert "verdict" not in batches and report["within_limit"]
    report["dataset_mib"] = 128.0  # what write_dataset would have made
    assert_fits_or_whole(lambda r: larger_than_ram.print_report(r, False), report, larger_than_ram.PROCESS_COLUMNS,
                         capsys, monkeypatch)


def copied_checkout(copy: Path) -> train_bench.Checkout:
    """This checkout's memtrain copied into a git repo of its own at ``copy``, as another checkout."""
    shutil.copytree(Path(memtrain.__file__).parent, copy / "memtrain", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q", str(copy)], check=True)
    subprocess.run(["git", "-C", str(copy), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(copy), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "old"],
                   check=True)
    return train_bench.other_checkout(copy)


def test_another_checkout_s_run_reports_its_cpu_time(tmp_path: Path) -> None:
    """bench train's CPU ms/update column has a figure for an --against row too (run_once keeps cpu_seconds)."""
    from memtrain.benchmarks.synthetic import write_dataset

    checkout = copied_checkout(tmp_path / "old")
    data = write_dataset(tmp_path / "data", 4 * 16, 16, features=8, classes=3)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = train_bench.run_once(checkout.method, Problem(str(data), 4, 4, workers=2, batch=16, epochs=1),
                                  scratch, "auto", checkout=checkout)
    assert result["cpu_seconds"] > 0


def test_a_name_is_found_where_an_older_layout_kept_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--against` an older checkout: train/ had no folders before, so `train` lived in memtrain.train.server
    (a module, not a package). The first module of the list that has the name gives it; none: a clear error."""
    package = tmp_path / "oldlayout"
    (package / "train").mkdir(parents=True)
    for init in (package / "__init__.py", package / "train" / "__init__.py"):
        init.write_text("")
    (package / "train" / "server.py").write_text("def train():\n    return 'old'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = checkout_run.imported("train", ("oldlayout.train.server.server", "oldlayout.train.server"))
    assert found() == "old"
    with pytest.raises(ImportError, match="no read_lineage in any of oldlayout.train.lineage"):
        checkout_run.imported("read_lineage", ("oldlayout.train.lineage",))
    assert checkout_run.imported("train").__module__ == "memtrain.train.server.server"  # this checkout's


def test_the_benchmark_job_stages_no_best_epoch(tmp_path: Path) -> None:
    """Both checkouts run the same job: run.keep_best is false, passed where the checkout knows the key (its
    default became true after ff71786, false there without train.patience: a best epoch's files copied at every
    improving epoch by one checkout only)."""
    spec = {"dataset": str(tmp_path / "data"), "hidden": 8, "epochs": 2, "batch": 64, "tasks": 2, "workers": 0,
            "seed": 0, "optimizer": {"name": "sgd", "lr": 0.1}, "run_dir": str(tmp_path / "run")}
    assert checkout_run.job_for(spec).run.keep_best is False
