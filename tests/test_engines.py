"""The engines (memtrain/train/server/engines.py): who steps, behind one interface, chosen once by ``Trainer.choose``.

End to end through the CLI on a tiny dataset in the server (no worker processes, so fast): each job gets the
engine and schedule its mode names, the epoch loop runs it until each epoch is done and closes it once; and
the engines' own contracts, without processes."""

from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_data import blobs, write_dataset

from memtrain.cli import main
from memtrain.layout import weight_versions
from memtrain.train.exchange.marks import STEP, Activity
from memtrain.train.messages import GradTask
from memtrain.train.schedule import ArrivalAgenda, PlannedAgenda, RecordedAgenda
from memtrain.train.server import engines, server
from memtrain.train.server.choice import ENGINES, engine_of
from memtrain.train.server.engines import ClusterRounds, Desk, EngineContext, Rounds, ServerSteps
from memtrain.train.server.onepass import OnePass
from memtrain.train.server.replay import Replay
from memtrain.train.timing import UNTIMED

JOB = """
[data]
path = "{data}"

[model]
kind = "softmax"

[train]
epochs = 2
batch_size = 60
tasks_per_update = 2
lr = 0.05
workers = 0
{train}

[run]
dir = "{run}"
"""


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=300, features=4, classes=3, seed=1)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=100)


@pytest.fixture
def chosen(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """Each run's engine as ``Trainer.choose`` returned it, with the agendas it ran and its runs and closes."""
    seen: list[dict] = []
    choose = server.Trainer.choose

    def recording(self: server.Trainer, position: object) -> object:
        engine = choose(self, position)
        entry = {"engine": engine, "runs": 0, "closed": 0, "agendas": []}
        seen.append(entry)
        run, close = engine.run, engine.close

        def counted_run(position: object) -> None:
            entry["runs"] += 1
            run(position)

        def counted_close() -> None:
            entry["closed"] += 1
            close()

        engine.run, engine.close = counted_run, counted_close
        if isinstance(engine, ServerSteps):
            schedule = engine.schedule

            def agenda(position: object, updates: object) -> object:
                entry["agendas"].append(schedule.agenda(position, updates))
                return entry["agendas"][-1]

            engine.schedule = SimpleNamespace(agenda=agenda)
        return engine

    monkeypatch.setattr(server.Trainer, "choose", recording)
    return seen


def train(tmp_path: Path, data: Path, train: str, *args: str, kind: str = "softmax") -> Path:
    job = tmp_path / "job.toml"
    job.write_text(JOB.format(data=data, train=train, run=tmp_path / "run").replace('"softmax"', f'"{kind}"'))
    assert main(["train", str(job), "--quiet", *args]) == 0
    return tmp_path / "run"


@pytest.mark.parametrize(("train_keys", "engine", "agenda"), [
    ("", Rounds, None),
    ('staleness = 1\nstaleness_in = "stream"', ServerSteps, PlannedAgenda),
    ('mode = "async"\nasync_group = 2', ServerSteps, ArrivalAgenda),
])
def test_each_mode_runs_its_engine_and_schedule_once_chosen(tmp_path: Path, data: Path, chosen: list[dict],
                                                           train_keys: str, engine: type,
                                                           agenda: type | None) -> None:
    run = train(tmp_path, data, train_keys)
    [entry] = chosen
    assert type(entry["engine"]) is engine
    assert entry["runs"] == 2, "the epoch loop runs the engine once per epoch (nothing cut it short)"
    assert entry["closed"] == 1
    if agenda is not None:
        assert [type(a) for a in entry["agendas"]] == [agenda, agenda], "one agenda per epoch"
    assert weight_versions(run)[-1] > 0


def test_a_replay_is_the_server_engine_with_the_recorded_schedule(tmp_path: Path, data: Path,
                                                                  chosen: list[dict]) -> None:
    """Chosen like every engine: the server's whole-vector loop with the lineage's schedule, run once."""
    run = train(tmp_path, data, 'mode = "async"\nasync_group = 2')
    assert main(["train", "--replay", str(run), "--quiet", "--run-dir", str(tmp_path / "replay"),
                 "--workers", "0"]) == 0
    replay = chosen[-1]
    assert type(replay["engine"]) is Replay and isinstance(replay["engine"], ServerSteps)
    assert replay["runs"] == 1 and replay["closed"] == 1
    assert [type(a) for a in replay["agendas"]] == [RecordedAgenda]


def test_an_additive_model_is_its_one_pass_engine_run_once(tmp_path: Path, data: Path, chosen: list[dict]) -> None:
    """Chosen like every engine: one run (its statistics and its solve) whatever train.epochs says; a resume of
    the solved run finds nothing left to run."""
    run = train(tmp_path, data, "", kind="naive_bayes")
    [entry] = chosen
    assert type(entry["engine"]) is OnePass and entry["runs"] == 1 and entry["closed"] == 1
    assert weight_versions(run) == [0, 1]
    assert main(["train", "--resume", str(run), "--quiet"]) == 0
    assert chosen[-1]["runs"] == 0 and weight_versions(run) == [0, 1]


def context(**fields: object) -> SimpleNamespace:
    """An engine's context (engines.EngineContext) with only the fields a test reads."""
    return SimpleNamespace(placement=None, timer=UNTIMED, **fields)


def test_the_cluster_rounds_are_run_by_the_server_alone_and_never_recycle_versions() -> None:
    cluster, rounds = ClusterRounds(context(), files=None), Rounds(context())
    assert cluster.alone() and not cluster.recycle and rounds.recycle


def test_an_engine_is_handed_its_context_never_the_trainer() -> None:
    fields = {field.name for field in dataclasses.fields(EngineContext)}
    assert "trainer" not in fields and EngineContext.__dataclass_params__.frozen
    with pytest.raises(TypeError):
        EngineContext(**{name: None for name in fields} | {"extra": None})
    signature = inspect.signature(ServerSteps)
    assert list(signature.parameters) == ["context", "files", "schedule"]
    assert "server" not in {name.split(".")[-1] for name in engines_imports()}, "engines never import the server"


def engines_imports() -> set[str]:
    tree = ast.parse(Path(engines.__file__).read_text())
    return {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}


def test_each_engine_names_a_participants_activity_in_its_own_words() -> None:
    plan = SimpleNamespace(update=lambda update: SimpleNamespace(update=update, tasks=(), epoch=0))
    step = Activity(slot=0, generation=1, kind=STEP, update=4, item=0, started=0.0)
    rounds = Rounds(context(plan=plan, size=10_000))
    assert rounds.describe_activity(step) == "step slice 0 (parameters 0-10000) of update 5"
    desk = Desk(context(per_epoch=3))
    assert desk.describe_activity(step) == "the step of update 5"


def test_a_gradient_task_is_named_by_the_engine_that_handed_it_out() -> None:
    """The plan's rounds (a cluster's) number a task within its update; the server's whole-vector engine hands out
    tickets (async) or a replay's steps, so its words give the rows and the version read. The Trainer asks the
    engine it chose, no flag of its own."""
    words = context(describe_rows=lambda lo, hi, epoch: f"rows {lo}-{hi} of epoch {epoch + 1}")
    task = GradTask(task=2, attempt=0, ticket=7, version=5, epoch=1, lo=10, hi=20)
    cluster = ClusterRounds(words, files=None)
    assert cluster.describe_gradient(task) == "gradient task 2 (rows 10-20 of epoch 2) of update 8"
    steps = ServerSteps.__new__(ServerSteps)  # its loop is not needed for words
    steps.context = words
    assert steps.describe_gradient(task) == "gradient task (rows 10-20 of epoch 2) at weight version 5"
    trainer = server.Trainer.__new__(server.Trainer)
    trainer.engine = steps
    assert trainer.describe_task(task) == steps.describe_gradient(task)



@pytest.mark.parametrize(("mode", "staleness_in", "cluster", "additive", "replaying", "engine", "placement"), [
    ("sync", "rounds", "", False, False, "rounds", "rounds"),
    ("sync", "stream", "", False, False, "stream", "stream"),
    ("async", "rounds", "", False, False, "async", "desk"),
    ("async", "rounds", "", False, True, "replay", "stream"),
    ("sync", "rounds", "local:2", False, False, "cluster", "cluster"),
    ("sync", "rounds", "", True, False, "solve", "rounds"),
])
def test_the_engine_is_one_row_of_one_table(mode: str, staleness_in: str, cluster: str, additive: bool,
                                            replaying: bool, engine: str, placement: str) -> None:
    """Which engine a run gets is one lookup (choice.engine_of, then ENGINES): the additive solve and the replay
    are rows like the others, and only the whole ones (a replay, a solve) run once."""
    staleness = 1 if staleness_in == "stream" else 0
    job = SimpleNamespace(train=SimpleNamespace(mode=mode, staleness=staleness, staleness_in=staleness_in),
                          run=SimpleNamespace(cluster=cluster))
    assert engine_of(job, additive=additive, replaying=replaying) == engine
    assert ENGINES[engine].placement == placement
    assert ENGINES[engine].whole == (engine in ("replay", "solve")) and ENGINES[engine].one_pass == (engine == "solve")
