"""The training core's timing hook (memtrain/train/timing.py): a tiny run hands every named section to the
timer it is given, and untimed (the default) nothing is wrapped: the parts call what they called before."""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_data import blobs, write_dataset

from memtrain.config import load_job
from memtrain.files import read_jsonl
from memtrain.layout import RUN_METRICS
from memtrain.train.loops.gradient import TaskGradient
from memtrain.train.server.server import train
from memtrain.train.timing import SECTIONS, UNTIMED, Recording, timed, timed_sections

pytestmark = pytest.mark.timeout(120)
# the sections a run whose rounds stay in the server goes through (the cluster's: tests/test_cluster.py's runs)
# the server alone readies no version file per update ("ready"): its ring's files are readied once per stretch
IN_THE_SERVER = {"model", "gradient task", "rows", "step", "publish", "round", "stretch_chores", "evaluate",
                 "end_epoch", "rounds"}


def test_a_tiny_run_records_every_named_section_it_goes_through(tmp_path: Path) -> None:
    x, y = blobs(n=400, features=6, classes=3, seed=1)
    data = write_dataset(tmp_path / "blobs", x, y)
    job = tmp_path / "job.toml"
    job.write_text(f'[data]\npath = "{data}"\n[model]\nkind = "mlp"\nhidden = [8]\n[train]\nepochs = 2\n'
                   f'batch_size = 60\ntasks_per_update = 2\nworkers = 0\n[run]\ndir = "{tmp_path / "run"}"\n')
    timer = Recording()
    train(load_job(job), quiet=True, timer=timer)
    updates = sum(1 for record in read_jsonl(tmp_path / "run" / RUN_METRICS) if record["kind"] == "update")
    assert updates == 12  # 360 train rows in batches of 60, 2 epochs
    recorded = {name for name, times in timer.times.items() if times}
    assert IN_THE_SERVER <= recorded <= set(SECTIONS)
    assert len(timer.times["step"]) == updates  # one step each (publish is also asked when nothing waits)
    assert len(timer.times["publish"]) >= updates
    assert len(timer.times["model"]) == len(timer.times["gradient task"]) == 2 * updates  # 2 tasks per update
    assert len(timer.times["end_epoch"]) == 2
    assert all(seconds >= 0 for times in timer.times.values() for seconds in times)


def test_untimed_the_parts_call_their_own_functions() -> None:
    def step() -> None:
        pass

    assert timed(UNTIMED, "step", step) is step

    class Part:
        def publish(self) -> None:
            pass

    part = Part()
    timed_sections(part, UNTIMED, ("publish",))
    assert vars(part) == {}  # nothing on the instance: a call finds the class's method, as before

    class Model:
        def loss_and_grad(self) -> float:
            return 0.0

    model = Model()
    assert TaskGradient(model, seed=0).loss_and_grad == model.loss_and_grad


def test_a_section_not_declared_is_refused() -> None:
    with pytest.raises(ValueError, match="not a named section"):
        timed(Recording(), "steps", lambda: None)
