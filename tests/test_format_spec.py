"""docs/formats.md against the code: every name memtrain/layout.py can produce is in the spec, every file the
spec names is one layout.py produces and the code writes, and the format names in the spec are the ones
the files on disk carry."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest

from memtrain import layout
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
    "slurm_rendezvous_path": lambda: [layout.slurm_rendezvous_path(Path("runs/digits-mlp"), "4242", 1).name],
}
# Functions that read names back (parsers and listings) and the prefix of a name made above.
READERS = {"parse_partial_name", "prepare_work_dirs", "weight_versions",
           "checkpoint_updates", "parse_exchange_owner", "tmp_owner_pid",
           "spool_job_name", "tmp_target", "is_version_name", "is_checkpoint_name", "is_shard_name",
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
    assert main(["serve", "--jobs", str(jobs), "--once"]) == 0
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
