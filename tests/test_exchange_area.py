"""The exchange area has one owner (memtrain/train/exchange/area.py): every file a real run leaves in it is of a
registered kind, docs/formats.md's table of its files is the registry, and nothing of a run is left in it after
a clean end, a stop by SIGTERM, or a SIGKILL and a resume."""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_data import blobs, write_dataset

from memtrain import layout
from memtrain.train.exchange import area

pytestmark = pytest.mark.timeout(240)
TESTS = Path(__file__).parent
SPEC = (TESTS.parent / "docs" / "formats.md").read_text()
PYTHONPATH = os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))

# One file name of each kind, as the code makes it.
EXAMPLES = {
    area.MARK: [()], area.GRADIENT_BUFFER: [(0, 0), (3, 1)], area.DIGESTS: [()], area.BOARD: [()],
    area.RECORDS: [()], area.OPTIMIZER_STATE: [("m", 0), ("v", 1)], area.DESK_BUFFER: [(0, 0), (2, 4)],
    area.DESK_WORDS: [()], area.DESK_TASKS: [()], area.DESK_RECORDS: [()], area.SPARE_GRADIENT: [(390, 1, 0)],
    area.STATE_BUILDING: [("m", 391)], area.CHAIN_SUM: [(390, 0, 7, 3)], area.STREAMED_GRADIENT: [(390, 1, 2)],
    area.METRICS: [(390, 1, 0)],
    area.WAVE: [("0123456789ab", 4), ("0123456789ab", 4, 2), ("0123456789ab",)],
    area.CLUSTER_PROBE: [("0123456789ab",)],
}


def test_every_kind_matches_the_names_it_makes_and_no_other_kind_does() -> None:
    assert set(EXAMPLES) == set(area.KINDS)
    for kind, examples in EXAMPLES.items():
        assert kind.lifetime in area.LIFETIMES
        for numbers in examples:
            name = kind.name(*numbers)
            assert area.kind_of(name) is kind, name
            assert area.kind_of(layout.tmp_sibling(Path(name)).name) is kind  # a file being written
    assert area.kind_of("notes.npy") is None and area.kind_of("g-v00000001-t00000-a000.npy") is None


def test_discard_builds_no_regex_per_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each kind's regex is compiled once, at its first use: ``discard`` runs on an update's path (a stretch's
    spares, a too stale gradient, an evaluation's metrics), where building every kind's regexes per file cost
    0.3 ms a file (issue 39's "no update slower")."""
    assert area.kind_of("notes.npy") is None  # every kind asked once: its regex compiled and kept

    def built(template: str) -> re.Pattern[str]:
        raise AssertionError(f"a regex built per call: {template}")

    monkeypatch.setattr(area, "template_regex", built)
    path = area.METRICS.path(tmp_path, 390, 1, 0)
    path.write_bytes(b"metrics")
    area.discard([path, area.STREAMED_GRADIENT.path(tmp_path, 390, 1, 2)])  # the second one already gone
    assert not path.exists()
    assert area.kind_of("notes.npy") is None


def test_discard_refuses_a_name_it_does_not_register(tmp_path: Path) -> None:
    (tmp_path / "notes.npy").write_bytes(b"a user's")
    with pytest.raises(ValueError, match="not a file of the exchange area"):
        area.discard([tmp_path / "notes.npy"])
    assert (tmp_path / "notes.npy").exists()
    area.discard([area.METRICS.path(tmp_path, 1, 0, 0)])  # one already gone is no error


def test_the_docs_table_of_exchange_files_is_the_registry() -> None:
    table = re.search(r"^<!-- exchange files -->\n((?:\|.*\n)+)", SPEC, flags=re.M)
    assert table, "docs/formats.md has no <!-- exchange files --> table"
    rows = [[cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            for line in table.group(1).splitlines()]  # a cell's own | is written \|
    assert rows[0] == ["file", "lifetime", "made by", "removed by"]
    documented = [(tuple(re.findall(r"`([^`]+)`", row[0])), *row[1:]) for row in rows[2:]]
    registered = [(kind.templates, kind.lifetime, kind.made_by, kind.removed_by) for kind in area.KINDS]
    assert documented == registered
    for lifetime in area.LIFETIMES:  # each lifetime is defined beside the table
        assert f"**{lifetime}**:" in SPEC, lifetime


# --- real runs ---

def memtrain(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memtrain", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": PYTHONPATH, **(env or {})}, timeout=200)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=1000, features=6, classes=3, seed=1)
    return write_dataset(tmp_path_factory.mktemp("exchange") / "blobs", x, y, shard_rows=300)


def write_job(folder: Path, data: Path, train: str, epochs: int = 3) -> tuple[Path, Path]:
    """A job whose exchange area is made in ``folder/exchange`` (so the test sees all of it); returns the job
    and that folder."""
    scratch = folder / "exchange"
    scratch.mkdir(parents=True)
    job = folder / "job.toml"
    job.write_text(f'[data]\npath = "{data}"\n[model]\nkind = "mlp"\nhidden = [16]\n'
                   f'[train]\nepochs = {epochs}\nbatch_size = 100\ntasks_per_update = 3\noptimizer = "adam"\n'
                   f'seed = 3\n{train}\n[run]\ndir = "{folder / "run"}"\nexchange = "{scratch}"\n')
    return job, scratch


def in_areas(scratch: Path) -> list[str]:
    """Every file in the exchange areas under ``scratch`` (one per run start)."""
    return sorted(p.name for folder in scratch.iterdir() for p in folder.iterdir())


# Each engine, the kinds of file it must leave when its server is killed mid-stretch (update 5 logged).
ENGINES = {
    "rounds": ("workers = 2", {area.GRADIENT_BUFFER, area.BOARD, area.RECORDS, area.DIGESTS, area.OPTIMIZER_STATE}),
    "rounds in the server": ("workers = 0", {area.GRADIENT_BUFFER, area.BOARD, area.OPTIMIZER_STATE}),
    "desk": ('workers = 2\nmode = "async"', {area.DESK_WORDS, area.DESK_TASKS, area.DESK_RECORDS, area.DESK_BUFFER}),
    "stream": ('workers = 2\nstaleness = 1\nstaleness_in = "stream"', {area.OPTIMIZER_STATE}),
}
# a streamed gradient is renamed into a spare once stepped: which of the two a kill finds depends on the moment
STREAMED = {area.STREAMED_GRADIENT, area.SPARE_GRADIENT}


@pytest.mark.parametrize("engine", ENGINES)
def test_a_run_killed_mid_stretch_leaves_only_registered_files_and_a_resume_none(tmp_path: Path, data: Path,
                                                                                  engine: str) -> None:
    train, expected = ENGINES[engine]
    job, scratch = write_job(tmp_path, data, train)
    killed = memtrain("train", job, env={"MEMTRAIN_FAULT": "after_update_logged:5"})
    assert killed.returncode == -9, killed.stderr
    names = in_areas(scratch)
    assert names, "the killed run left no exchange area to look at"
    unregistered = [name for name in names if area.kind_of(name) is None]
    assert not unregistered, f"files in the exchange no kind of train/exchange/area.py registers: {unregistered}"
    found = {area.kind_of(name) for name in names}
    assert expected <= found, sorted(k.templates[0] for k in expected - found)
    assert engine != "stream" or found & STREAMED
    resumed = memtrain("train", "--resume", tmp_path / "run")
    assert resumed.returncode == 0, resumed.stderr
    assert list(scratch.iterdir()) == [], "the resume left the killed run's exchange area, or its own"


def test_a_cluster_run_leaves_only_registered_files(tmp_path: Path, data: Path) -> None:
    pytest.importorskip("distributed")
    job, scratch = write_job(tmp_path, data, "workers = 1", epochs=2)
    killed = memtrain("train", job, "--cluster", "local:1", env={"MEMTRAIN_FAULT": "after_update_logged:4"})
    assert killed.returncode == -9, killed.stderr
    names = in_areas(scratch)
    assert [name for name in names if area.kind_of(name) is None] == []
    # (its gradient files come and go within an update: whether a kill finds one depends on the moment)
    assert area.OPTIMIZER_STATE in {area.kind_of(name) for name in names}, names


def test_a_clean_end_and_a_sigterm_stop_leave_nothing_in_the_exchange(tmp_path: Path, data: Path) -> None:
    job, scratch = write_job(tmp_path / "clean", data, "workers = 2", epochs=1)
    assert memtrain("train", job).returncode == 0
    assert list(scratch.iterdir()) == []
    job, scratch = write_job(tmp_path / "stopped", data, "workers = 2", epochs=40)
    proc = subprocess.Popen([sys.executable, "-m", "memtrain", "train", str(job)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": PYTHONPATH})
    lineage = tmp_path / "stopped" / "run" / "lineage.jsonl"
    deadline = time.monotonic() + 60
    while not (lineage.exists() and lineage.read_text().count("\n") > 5):
        assert time.monotonic() < deadline and proc.poll() is None, "the run never got going"
        time.sleep(0.02)
    assert in_areas(scratch), "a running run has its exchange area"
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert list(scratch.iterdir()) == []


def test_no_module_but_the_owner_removes_exchange_files() -> None:
    """Textual: a removal (unlink, remove, rmtree) on a line that names the exchange, outside area.py. Every
    removal of an exchange file goes through ``area.discard`` or ``area.remove_area``."""
    removal = re.compile(r"\b(unlink|remove|rmtree)\(")
    found = [f"{path.relative_to(TESTS.parent)}:{number}: {line.strip()}"
             for path in (TESTS.parent / "memtrain").rglob("*.py") if path.name != "area.py"
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if removal.search(line) and "exchange" in line]
    assert not found, found


def test_no_module_but_the_owner_names_an_exchange_file() -> None:
    """layout.py's names of exchange files are used by area.py alone: every other module gets its paths from
    the kinds (``area.BOARD.path(exchange)``, ...). The cluster's probe name also names the run directory's
    probe, which is not an exchange file."""
    source = (TESTS.parent / "memtrain" / "train" / "exchange" / "area.py").read_text()
    names = set(re.findall(r"\blayout\.(\w+)", source)) - {"tmp_target", "tmp_sibling", "cluster_probe_name"}
    assert {"ROUND_BOARD", "gradient_buffer_name", "streamed_gradient_name", "EXCHANGE_MARK"} <= names
    found = []
    for path in (TESTS.parent / "memtrain").rglob("*.py"):
        if path.name in ("layout.py", "area.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "memtrain.layout":
                found += [f"{path.name}: {alias.name}" for alias in node.names if alias.name in names]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "layout" \
                    and node.attr in names:
                found.append(f"{path.name}: layout.{node.attr}")
    assert not found, found
