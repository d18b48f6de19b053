"""docs/formats.md against the code: every name memtrain/layout.py can produce is in the spec, every file the
spec names is one layout.py produces and the code writes, and the format names in the spec are the ones
the files on disk carry."""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from in_process import here

from memtrain import layout, records
from memtrain.cli import main

pytestmark = pytest.mark.timeout(180)
ROOT = Path(__file__).resolve().parent.parent
SPEC = (ROOT / "docs" / "formats.md").read_text()

# One example of every name a function of layout.py makes. A new name-making function must be added here
# (and to the spec): test_every_layout_function_is_classified fails until it is.
MADE = {
    "shard_name": lambda: [layout.shard_name(split, part, i) for split in layout.SPLITS for part in "xy"
                           for i in (0, 1)],
    "prepare_work_dir": lambda: [layout.prepare_work_dir(Path("OUT"), "a1b2").name],
    "spool_bucket_names": lambda: list(layout.spool_bucket_names(7)),
    "weights_path": lambda: [layout.weights_path(Path(), 390).as_posix()],
    "checkpoint_path": lambda: [layout.checkpoint_path(Path(), 390).as_posix()],
    "optimizer_state_name": lambda: [layout.optimizer_state_name("m"), layout.optimizer_state_name("v")],
    "checkpoint_version_name": lambda: [layout.checkpoint_version_name(388)],
    "exchange_dir_name": lambda: [layout.exchange_dir_name("ab12cd34", 4242)],
    "gradient_name": lambda: [layout.gradient_name(390, 1, 0)],
    "statistics_dir": lambda: [layout.statistics_dir(Path()).as_posix()],
    "partial_name": lambda: [layout.partial_name(1, 0)],
    "statistics_record_name": lambda: [layout.statistics_record_name(layout.partial_name(1, 0)),
                                       layout.statistics_record_name(layout.STATISTICS_SUM)],
    "run_folder": lambda: [layout.run_folder(Path(), name).as_posix() for name in layout.RUN_FOLDERS],
    "metrics_name": lambda: [layout.metrics_name(390, 1, 0)],
    "streamed_gradient_name": lambda: [layout.streamed_gradient_name(390, 1, 0)],
    "tensorboard_suffix": lambda: [f"{layout.TENSORBOARD_EVENTS}1795682640.vm{layout.tensorboard_suffix(0, 'c72')}"],
    "spare_gradient_name": lambda: [layout.spare_gradient_name(390, 1, 0)],
    "gradient_buffer_name": lambda: [layout.gradient_buffer_name(task, bank) for task in (0, 3) for bank in (0, 1)],
    "building_path": lambda: [layout.building_path(Path(), 391, 4242).as_posix()],
    "private_path": lambda: [layout.private_path(Path(), 2, 4242).as_posix()],
    "state_buffer_name": lambda: [layout.state_buffer_name("m", 0), layout.state_buffer_name("v", 1)],
    "state_building_name": lambda: [layout.state_building_name("m", 391), layout.state_building_name("v", 391)],
    "desk_buffer_name": lambda: [layout.desk_buffer_name(0, 0), layout.desk_buffer_name(1, 4)],
    "tmp_sibling": lambda: [layout.tmp_sibling(Path("meta.json")).name,
                            layout.tmp_sibling(Path(layout.EXCHANGE_PROBE)).name],
    "spool_job_file": lambda: [layout.spool_job_file("NAME"), layout.spool_job_file("NAME~1")],
    "spool_state_file": lambda: [layout.spool_state_file("NAME")],
    "spool_result_file": lambda: [layout.spool_result_file("NAME"), layout.spool_result_file("NAME~1")],
    "spool_log_file": lambda: [layout.spool_log_file("NAME")],
    "spool_archive_name": lambda: [layout.spool_archive_name("NAME", 1), layout.spool_archive_name("NAME", 2)],
    "spool_record_stem": lambda: [layout.spool_job_file(layout.spool_record_stem("NAME"))],
    "cluster_probe_name": lambda: [layout.cluster_probe_name("0123456789ab")],
    "trajectory_name": lambda: [layout.trajectory_name(390, 7)],
    "rl_gradient_name": lambda: [layout.rl_gradient_name(390, 7)],
    "rl_step_name": lambda: [layout.rl_step_name(390)],
    "rl_share_name": lambda: [layout.rl_share_name(390, 2, 1)],
    "episode_state_name": lambda: [layout.episode_state_name(7)],
    "chain_sum_name": lambda: [layout.chain_sum_name(390, 0, 12, 3)],
    "wave_file_name": lambda: [layout.wave_file_name("r0123", 5), layout.wave_file_name("r0123", 5, 2),
                               layout.wave_file_name("r0123", 5, "all"),
                               layout.wave_file_name("r0123")],
    "numbered_run_dir": lambda: [layout.numbered_run_dir(Path("runs/digits-mlp"), 2).as_posix()],
    "slurm_rendezvous_path": lambda: [layout.slurm_rendezvous_path(Path("runs/digits-mlp"), "4242", 1).name],
}
# Functions that read names back (parsers and listings) and the prefix of a name made above.
READERS = {"parse_partial_name", "prepare_work_dirs", "weight_versions",
           "checkpoint_updates", "parse_exchange_owner", "tmp_owner_pid",
           "spool_job_name", "tmp_target", "is_version_name", "is_checkpoint_name", "is_private_name", "is_shard_name",
           "is_rl_step_file",
           "existing_hint"}
# Constants that are parts of names, not names: each must occur inside a name made above.
FRAGMENTS = {"PREPARE_WORK_MARK", "TMP_MARK", "EXCHANGE_PREFIX", "SPOOL_JOB_SUFFIX", "EXCHANGE_PROBE",
             "TENSORBOARD_EVENTS"}
# Names the user chooses (the root of a listing), not memtrain.
USER_NAMES = {"OUT", "runs", "digits-mlp", "jobs"}


def layout_constants() -> dict[str, list[str]]:
    found = {}
    for key, value in vars(layout).items():
        if key.isupper() and not key.startswith("_") and isinstance(value, str | tuple):  # not limits
            found[key] = list(value) if isinstance(value, tuple) else [value]
    return found


def layout_names() -> list[str]:
    """Every name layout.py can produce: its constants and one call of each name-making function."""
    made = [name for make in MADE.values() for name in make()]
    constants = [v for key, values in layout_constants().items() if key not in FRAGMENTS for v in values]
    return made + constants


def template_regex(template: str) -> re.Pattern[str]:
    """``vNNNNNNNN.npy`` -> v + 8 digits + .npy; ``<anything>`` and ``NAME`` -> one path component."""
    parts = re.split(r"(<[^>]+>|NAME|N{3,})", template)
    regex = ""
    for part in parts:
        if part.startswith("<") or part == "NAME":
            regex += r"[^/]+"
        elif re.fullmatch(r"N{3,}", part):
            regex += rf"\d{{{len(part)}}}"
        else:
            regex += re.escape(part)
    return re.compile(regex)


PLACEHOLDER = r"<[\w |]+>"
NAME_TOKEN = re.compile(rf"(?:[\w.|~-]|{PLACEHOLDER})+(?:/(?:[\w.|~-]|{PLACEHOLDER})*)*")
FILE_LIKE = re.compile(r"\.(npy|json|jsonl|log|bin|toml|lock)/?$|/$|^c?N{8}$|~\d$|\.tmp-")
BARE_EXTENSION = re.compile(r"\.(npy|npz|h5|jsonl?|toml)")  # `.npy` names a kind of file, not a file


def spec_name_templates() -> set[str]:
    """File and directory names the spec names: the entries of its listings and its inline file names.

    A listing is an unlabelled code block: its first line is the root (a name the user chose), an entry is
    the first word of a line indented by at most 6 spaces (deeper lines continue a description), and any
    word that looks like a file name counts too.
    """
    names = set()
    for block in re.findall(r"^```\n(.*?)^```", SPEC, flags=re.S | re.M):
        for line in block.splitlines()[1:]:
            words = line.split()
            if words and len(line) - len(line.lstrip()) <= 6 and NAME_TOKEN.fullmatch(words[0]):
                names.add(words[0])
            names.update(word for word in words if NAME_TOKEN.fullmatch(word) and FILE_LIKE.search(word))
    for span in re.findall(r"`([^`\n]+)`", SPEC):
        if NAME_TOKEN.fullmatch(span) and FILE_LIKE.search(span):
            names.add(span)
    return {name for name in names if not BARE_EXTENSION.fullmatch(name)}


def components(name: str) -> list[str]:
    return [part for part in name.split("/") if part]


def test_every_layout_function_is_classified() -> None:
    functions = {name for name, value in vars(layout).items()  # unwrap: a cached one (weights_path) counts too
                 if inspect.isfunction(inspect.unwrap(value)) and value.__module__ == layout.__name__
                 and not name.startswith("_")}
    assert functions == set(MADE) | READERS


def test_every_layout_name_is_in_the_spec() -> None:
    regexes = [template_regex(part) for template in spec_name_templates() for part in components(template)]
    missing = sorted({part for name in layout_names() for part in components(name)
                      if not any(regex.fullmatch(part) for regex in regexes)})
    assert not missing, f"names memtrain/layout.py makes that docs/formats.md does not specify: {missing}"


def test_fragments_are_parts_of_names() -> None:
    names = [name for make in MADE.values() for name in make()]
    for key in FRAGMENTS:
        value = getattr(layout, key)
        assert any(value in name for name in names), key


def test_every_name_in_the_spec_is_made_by_layout() -> None:
    made = {part for name in layout_names() for part in components(name)} | USER_NAMES
    unknown = sorted({template for template in spec_name_templates() for part in components(template)
                      if not any(template_regex(part).fullmatch(name) for name in made)})
    assert not unknown, f"docs/formats.md names files that memtrain/layout.py never makes: {unknown}"


def test_every_layout_name_is_used_by_the_code() -> None:
    """A constant or function of layout.py that no module uses names a file nothing writes."""
    code = "\n".join(path.read_text() for path in (ROOT / "memtrain").rglob("*.py") if path.name != "layout.py")
    names = [key for key in layout_constants() if key not in FRAGMENTS] + [*MADE, *READERS]
    unused = [key for key in names if not re.search(rf"\b{key}\b", code)]
    assert not unused, f"memtrain/layout.py names that no module uses: {unused}"


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dataset, a finished run and a served job, made by the CLI: what the code really writes."""
    root = tmp_path_factory.mktemp("spec")
    assert main(["prepare", "--synthetic", "400x4", str(root / "data"), "--classes", "3", "--shard-mb", "0.004"]) == 0
    assert main(["train", str(ROOT / "jobs" / "examples" / "softmax.toml"), "--set", f'data.path="{root / "data"}"',
                 "--set", "train.epochs=2", "--set", "train.batch_size=100", "--run-dir", str(root / "run"),
                 "--set", 'run.log_to=["csv", "tensorboard"]',  # every file a run may write
                 "--workers", "1"]) == 0
    jobs = root / "jobs"
    jobs.mkdir(mode=0o700)
    (jobs / "job.toml").write_text(f'[data]\npath = "{root / "data"}"\n[model]\nkind = "softmax"\n'
                                   f'[train]\nepochs = 1\nworkers = 1\n[run]\ndir = "{root / "served"}"\n')
    assert main(["serve", "--jobs", str(jobs), "--once", "--settle", "0.05"]) == 0  # the file is whole: no 1 s wait
    return root


def test_every_file_written_is_in_the_spec(written: Path) -> None:
    regexes = [template_regex(part) for template in spec_name_templates() for part in components(template)]
    on_disk = {part for path in written.rglob("*") for part in components(path.relative_to(written).as_posix())}
    unspecified = sorted(name for name in on_disk - {"data", "run", "served", "jobs", "job.toml"}
                         if not any(regex.fullmatch(name) for regex in regexes))
    assert not unspecified, f"files memtrain wrote that docs/formats.md does not specify: {unspecified}"


def test_the_spec_lists_the_files_of_a_run(written: Path) -> None:
    listing = re.search(r"^```\nruns/digits-mlp/\n(.*?)^```", SPEC, flags=re.S | re.M)
    assert listing
    entries = [line.split()[0] for line in listing.group(1).splitlines() if line.startswith("  ")
               and not line.startswith("      ")]
    checkpoint_files = listing.group(1).splitlines()[-1].split()
    run = written / "run"
    for entry in entries:
        matches = [p for p in run.glob(entry.split("/")[0] + "*")]
        assert matches, f"docs/formats.md lists {entry} in a run directory; the run has no such file"
    newest = sorted((run / "checkpoints").iterdir())[-1]
    assert sorted(checkpoint_files) == sorted(p.name for p in newest.iterdir())  # Adam: m and v


def test_format_names_are_the_ones_files_carry(written: Path) -> None:
    carried = {json.loads(path.read_text()).get("format")
               for name in ("manifest.json", "meta.json", "status.json", "job.json") for path in written.rglob(name)}
    carried |= {json.loads(path.read_text().splitlines()[0]).get("format") for path in written.rglob("lineage.jsonl")}
    named = set(re.findall(r'"(memtrain\.[\w-]+)"', SPEC)) | set(re.findall(r"\(`(memtrain\.[\w-]+)`,", SPEC))
    assert named == carried


# --- the fields of every JSON record (memtrain/records.py) against the spec's tables and real files ---

RECORD_TABLE = re.compile(r"^<!-- record: ([\w-]+) -->\n((?:\|.*\n)+)", flags=re.M)


def spec_tables() -> dict[str, dict[str, tuple[str, bool]]]:
    """Each marked table of the spec: field -> (type, optional). A field is a name in backticks in the first
    column (a row in capitals, SPLIT or COLUMN, describes a nested object); ``, optional`` ends the type of
    a field that may be absent."""
    tables: dict[str, dict[str, tuple[str, bool]]] = {}
    for match in RECORD_TABLE.finditer(SPEC):
        assert match.group(1) not in tables, f"docs/formats.md has two tables for record {match.group(1)}"
        rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in match.group(2).splitlines()]
        assert rows[0][:2] == ["field", "type"], f"table of {match.group(1)}: columns field | type | meaning"
        fields = {}
        for name, kind, *_ in rows[2:]:
            if re.fullmatch(r"`\w+`", name):
                fields[name.strip("`")] = (kind.removesuffix(", optional"), kind.endswith(", optional"))
        tables[match.group(1)] = fields
    return tables


def test_every_record_has_one_table_in_the_spec() -> None:
    assert set(spec_tables()) == {record.name for record in records.RECORDS}


@pytest.mark.parametrize("record", records.RECORDS, ids=lambda record: record.name)
def test_the_spec_table_is_the_declaration(record: records.Record) -> None:
    documented = spec_tables().get(record.name, {})
    declared = {f.name: (f.type, not f.required) for f in record.fields}
    extra, missing = sorted(set(documented) - set(declared)), sorted(set(declared) - set(documented))
    assert not extra, f"docs/formats.md, record {record.name}: fields not declared in memtrain/records.py: {extra}"
    assert not missing, f"docs/formats.md, record {record.name}: declared fields not documented: {missing}"
    wrong = {name: (documented[name], declared[name]) for name in declared if documented[name] != declared[name]}
    assert not wrong, f"{record.name}: (documented, declared) type and optional differ: {wrong}"


def run_cli(*args: object, env: dict[str, str] | None = None) -> int:
    """The CLI in a child process (a run killed by a fault point must not kill the test; a torch module's run must
    not import torch into the test's process)."""
    return subprocess.run([sys.executable, "-m", "memtrain", *map(str, args)], capture_output=True, timeout=170,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}).returncode


def run_here(*args: object) -> int:
    """The CLI in this process, quiet: the runs that need no process of their own (no fault point, no torch)."""
    return here(*args).returncode


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Datasets (synthetic classes and regression, a CSV table with an encoding) and runs of several kinds: a
    synchronous MLP on the table, resumed; async mode; an additive model killed after its sum, then resumed; a
    torch module on two tasks per update."""
    root = tmp_path_factory.mktemp("records")
    rows = ["a,b,c,label"] + [f"{i % 7 * 0.5},{'xyz'[i % 3] if i % 5 else ''},{'' if i % 11 == 0 else i},{'pq'[i % 2]}"
                              for i in range(240)]
    (root / "t.csv").write_text("\n".join(rows) + "\n")
    assert run_here("prepare", root / "t.csv", root / "table", "--label", "label", "-q") == 0
    assert run_here("prepare", "--synthetic", "400x4", root / "classes", "--classes", "3", "-q") == 0
    assert run_here("prepare", "--synthetic", "300x3", root / "numbers", "--task", "regression", "-q") == 0
    examples = ROOT / "jobs" / "examples"

    def train(job: str, data: str, run: str, *sets: str, env: dict[str, str] | None = None,
              cli: Callable[..., int] = run_here) -> int:
        settings = [arg for value in (f'data.path="{root / data}"', "train.batch_size=100", *sets)
                    for arg in ("--set", value)]
        return cli("train", examples / job, *settings, "--run-dir", root / run, "--workers", 1,
                   **({"env": env} if env else {}))

    assert train("digits-mlp.toml", "table", "mlp", "train.epochs=1") == 0
    assert run_here("train", "--resume", root / "mlp", "--set", "train.epochs=2") == 0
    assert train("softmax.toml", "classes", "async", "train.epochs=1", 'train.mode="async"') == 0
    assert train("ridge.toml", "numbers", "ridge", env={"MEMTRAIN_FAULT": "statistics_summed:1"}, cli=run_cli) == -9
    shutil.copytree(root / "ridge" / layout.STATISTICS_DIR, root / "statistics")  # removed once it is solved
    assert run_here("train", "--resume", root / "ridge") == 0
    assert train("digits-torch-mlp.toml", "classes", "torch", "train.epochs=1", "data.normalize=false",
                 cli=run_cli) == 0
    assert run_cli("prepare", root / "t.csv", root / "halfway", "--label", "label", "--shard-mb", "0.001", "-q",
                   env={"MEMTRAIN_FAULT": "prepare_after_shard:2"}) == -9  # leaves its work area: done.jsonl
    jobs = root / "jobs"
    jobs.mkdir(mode=0o700)
    (jobs / "job.toml").write_text(f'[data]\npath = "{root / "classes"}"\n[model]\nkind = "softmax"\n'
                                   f'[train]\nepochs = 1\nworkers = 1\n[run]\ndir = "{root / "served"}"\n')
    assert run_here("serve", "--jobs", jobs, "--once", "--settle", "0.05") == 0  # the file is whole: no 1 s wait
    return root


def records_written(root: Path) -> list[tuple[records.Record, str, dict[str, Any]]]:
    """(declaration, where, record) for every JSON record the runs wrote; a line's kind picks its declaration."""
    def lines(path: Path) -> list[tuple[str, dict[str, Any]]]:
        return [(f"{path}:{n}", json.loads(line)) for n, line in enumerate(path.read_text().splitlines(), 1)]

    found = []
    for path in root.rglob(layout.MANIFEST):
        manifest = json.loads(path.read_text())
        found.append((records.MANIFEST, str(path), manifest))
        if manifest["encoding"] is not None:
            found.append((records.ENCODING, f"{path}: encoding", manifest["encoding"]))
        found += [(records.SHARD, f"{path}: {split}", shard) for split, listing in manifest["splits"].items()
                  for shard in listing["shards"]]
    for path in root.rglob(layout.PREPARE_DONE_LOG):
        found += [record for where, line in lines(path)
                  for record in ((records.PREPARE_DONE, where, line), (records.SHARD, where, line["entry"]))]
    found += [(records.SERVE_STATUS, str(path), json.loads(path.read_text()))
              for path in root.rglob(layout.SPOOL_STATUS)]
    for run in (root / name for name in ("mlp", "async", "ridge", "torch")):
        found.append((records.JOB, str(run / layout.RUN_JOB), json.loads((run / layout.RUN_JOB).read_text())))
        found.append((records.PARAMS, str(run / layout.RUN_PARAMS), json.loads((run / layout.RUN_PARAMS).read_text())))
        found += [(records.HISTORY_START if line["event"] == "start" else records.HISTORY_RESUME, where, line)
                  for where, line in lines(run / layout.RUN_HISTORY)]
        found += [(records.LINEAGE_INIT if line["version"] == 0 else records.LINEAGE_SOLVE if "solve" in line
                   else records.LINEAGE_UPDATE, where, line) for where, line in lines(run / layout.RUN_LINEAGE)]
        found += [(records.METRICS_UPDATE if line["kind"] == "update" else records.METRICS_EPOCH, where, line)
                  for where, line in lines(run / layout.RUN_METRICS)]
        for path in (run / layout.CHECKPOINTS_DIR).glob(f"*/{layout.CHECKPOINT_META}"):
            meta = json.loads(path.read_text())
            found += [(records.CHECKPOINT, str(path), meta), (records.CHECKPOINT_POSITION, f"{path}: position",
                                                               meta["position"]),
                      (records.CHECKPOINT_DATA, f"{path}: data", meta["data"])]
    plan = root / "statistics" / layout.STATISTICS_PLAN
    found.append((records.STATISTICS_PLAN, str(plan), json.loads(plan.read_text())))
    found += [(records.STATISTICS_FILE, str(path), json.loads(path.read_text()))
              for path in (root / "statistics").glob("*.json") if path.name != layout.STATISTICS_PLAN]
    return found


def test_the_records_runs_write_are_the_declared_ones(runs: Path) -> None:
    written = records_written(runs)
    wrong = [f"{where}: {problem}" for record, where, obj in written for problem in records.problems(record, obj)]
    assert not wrong, "records that differ from their declaration in memtrain/records.py:\n" + "\n".join(wrong)
    kinds = {record.name for record, _, _ in written}
    assert kinds == {record.name for record in records.RECORDS}  # every declaration met on disk
    optional = {(record.name, f.name) for record, _, obj in written for f in record.fields
                if not f.required and f.name in obj}
    assert {("lineage-update", "ids"), ("metrics-epoch", "val_r2"), ("checkpoint-position", "arrival"),
            ("checkpoint-position", "planned")} <= optional


def test_a_writer_cannot_drift_from_the_declaration() -> None:
    """The writers build records through records.make: a field the declaration lacks, or a required one
    missing, is refused before anything is written."""
    from memtrain.train.records.logbook import update_record

    line = dict(version=3, update=3, epoch=1, batch=3, tasks=[(0, 10)], at=[2], lr=0.1, checksum="x")
    assert list(update_record(**line, ids=[4], discarded=0)) == [*records.LINEAGE_UPDATE.keys[:-1]]
    with pytest.raises(ValueError, match=r"lineage-update record: undeclared \['seconds'\]"):
        update_record(**line, seconds=[0.5])
    with pytest.raises(ValueError, match=r"missing \['kind'\]"):
        records.make(records.METRICS_EPOCH, epoch=1, update=3, version=3, loss=0.5, samples_per_s=1.0, time=0.0)


def test_a_records_keys_are_checked_once_and_a_wrong_list_is_still_refused() -> None:
    """make checks each list of keys once per process (a run makes two records per update with the same keys);
    a list it accepted never lets another through."""
    fields = dict(kind="update", epoch=1, batch=0, update=1, version=1, loss=0.5, rows=8, skipped=False,
                  compute_s=0.1, time=0.0)
    assert records.make(records.METRICS_UPDATE, **fields) == fields
    assert tuple(fields) in records.METRICS_UPDATE.accepted
    assert records.make(records.METRICS_UPDATE, **fields) == fields
    with pytest.raises(ValueError, match=r"undeclared \['seconds'\]"):
        records.make(records.METRICS_UPDATE, **fields, seconds=1.0)
    with pytest.raises(ValueError, match=r"missing \['kind'\]"):
        records.make(records.METRICS_UPDATE, **{key: value for key, value in fields.items() if key != "kind"})
