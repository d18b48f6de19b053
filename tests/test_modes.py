"""The mode keys (train.mode, staleness, staleness_in, max_staleness, async_group) through the CLI, and
lineage format 2.

Every mode key is range-checked (exit 2, naming the key, no run started), and a synchronous run's lineage
says, per gradient, the version it was computed at (its parent). The modes themselves: tests/test_async.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_train import dataset, write_job  # noqa: F401  (the module-scoped dataset fixture)

from memtrain.train.records.lineage import FORMAT_VERSION, read_lineage

pytestmark = pytest.mark.timeout(120)


def job_with(folder: Path, data: Path, keys: str) -> Path:
    job = write_job(folder, data, epochs=1)
    job.write_text(job.read_text().replace("workers = 2\n", f"workers = 2\n{keys}\n"))
    return job


@pytest.mark.parametrize(("keys", "message"), [
    ('mode = "fast"', "bad value for train.mode"),
    ("staleness = 65", "train.staleness out of range"),
    ("staleness = -1", "train.staleness out of range"),
    ("max_staleness = 2", "train.max_staleness applies only to train.mode = 'async'"),
    ('mode = "async"\nstaleness = 1', "train.staleness applies only to train.mode = 'sync'"),
    ('mode = "async"\nasync_group = 0', "train.async_group out of range"),
    ('mode = "async"\nmax_staleness = 65', "train.max_staleness out of range"),
    ('mode = "async"\nmax_staleness = 1.5', "wrong type for train.max_staleness"),
    ('staleness = 1\nstaleness_in = "auto"', "bad value for train.staleness_in"),
    ('staleness_in = "stream"', "train.staleness_in applies only to a fixed staleness"),
])
def test_mode_keys_are_checked(tmp_path: Path, dataset: Path, cli,  # noqa: F811
                                                          keys: str, message: str) -> None:
    result = cli("train", job_with(tmp_path, dataset, keys))
    assert result.code == 2, result.err
    assert message in result.err and "Traceback" not in result.err
    assert not (tmp_path / "run").exists(), "a refused job starts no run"


def test_a_sync_run_records_lineage_format_2_with_every_gradient_at_its_parent(tmp_path: Path, dataset: Path,  # noqa: F811
                                                                               cli) -> None:
    result = cli("train", job_with(tmp_path, dataset, 'mode = "sync"\nstaleness = 0'))
    assert result.code == 0, result.err
    lineage = read_lineage(tmp_path / "run")
    assert lineage.format_version == FORMAT_VERSION == 2 and lineage.seed == 7
    assert [s.version for s in lineage.steps] == list(range(1, lineage.final_version + 1))
    assert all(len(s.gradients) == 3 and {g.at for g in s.gradients} == {s.parent} for s in lineage.steps)
    assert lineage.staleness_histogram() == {0: 3 * lineage.final_version}
