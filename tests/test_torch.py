"""torch.nn.Module models end to end: agreement with a plain torch loop, bitwise identical weights in the server
alone and with 2 workers, worker and server kills, the buffer and randomness rules, start-up errors, export round
trips."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch_nets
from tiny_data import blobs, write_dataset

import memtrain
from memtrain.cli import main
from memtrain.dataset import open_dataset
from memtrain.layout import weight_versions, weights_path
from memtrain.models.params import ParamLayout
from memtrain.models.torch_bind import BINDINGS
from memtrain.train.context import data_spec, model_context
from memtrain.train.normalize import Normalizer
from memtrain.train.plan import Plan
from memtrain.train.records.metrics import evaluation, task_statistics

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
SEED, BATCH, TASKS, EPOCHS = 5, 100, 3, 2
JOB = """
[data]
path = "{data}"

[model]
kind = "torch"
factory = "{factory}"
{model}

[train]
epochs = {epochs}
batch_size = {batch}
tasks_per_update = {tasks}
optimizer = "{optimizer}"
lr = {lr}
{train}
seed = {seed}
workers = 2

[run]
dir = "run"
keep_versions = 40
"""


def write_job(folder: Path, data: Path, factory: str, *, model: str = "", optimizer: str = "sgd", lr: float = 0.1,
              train: str = "momentum = 0.9", epochs: int = EPOCHS) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(JOB.format(data=data, factory=factory, model=model, optimizer=optimizer, lr=lr,
                                                train=train, epochs=epochs, batch=BATCH, tasks=TASKS, seed=SEED))
    return folder / "job.toml"


def train_in_process(job: Path, *args: object) -> None:
    assert main(["train", str(job), *map(str, args)]) == 0


def memtrain_cli(*args: object, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m memtrain`` with only the package on PYTHONPATH: factories come from the job's directory."""
    return subprocess.run([sys.executable, "-m", "memtrain", *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, timeout=200)


def last_weights(run: Path) -> np.ndarray:
    return np.load(weights_path(run, weight_versions(run)[-1]), allow_pickle=False)


def digest(run: Path) -> str:
    return hashlib.sha256(last_weights(run).tobytes()).hexdigest()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    x, y = blobs(n=600, features=6, classes=3, seed=2)  # 540 training rows: 6 updates of 100 (the last 40)
    return write_dataset(tmp_path_factory.mktemp("torch") / "blobs", x, y, shard_rows=250)


@pytest.fixture(scope="module")
def mlp_run(data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The MLP trained by the server alone (--workers 0: this process has torch already; no outline child, no
    worker importing it), whose bits are those of workers (test_server_killed_then_resumed_is_bitwise_identical);
    version 0 from the outline's child is pinned by tests/test_goldens.py's torch-sync run."""
    job = write_job(tmp_path_factory.mktemp("mlp"), data, "torch_nets:mlp")
    train_in_process(job, "--workers", 0)
    return job.parent / "run"


@pytest.fixture(scope="module")
def bn_runs(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The BatchNorm + dropout net trained by the server alone (0 workers: every task in one process, as 1 worker
    does, in this process, which has torch already) and with 2 workers (AdamW: its weight decay must not touch the
    buffers). Not 1 and 4 workers as well: 7 more processes importing torch (~7 s of CPU), for the 3 tasks of an
    update in one process (the server's) and split unevenly (2 workers: 2 and 1); more workers than tasks is
    tests/test_train.py's test_any_worker_count_gives_bitwise_identical_weights[4] (4 workers, 3 tasks an update),
    and 1 worker test_server_killed_then_resumed_is_bitwise_identical's killed run."""
    runs = {}
    for workers in (0, 2):
        job = write_job(tmp_path_factory.mktemp(f"bn{workers}"), data, "torch_nets:bn_dropout", optimizer="adamw",
                        lr=0.01, train="weight_decay = 0.1")
        train_in_process(job, "--workers", workers)
        runs[workers] = job.parent / "run"
    return runs


# --- agreement with plain PyTorch ---

def test_matches_a_plain_torch_loop_to_float32_rounding(data: Path, mlp_run: Path) -> None:
    """Same module and initial weights (torch.manual_seed(seed) + the factory), same batches in the same
    order, same SGD with momentum: memtrain sums task gradients in task order, torch takes the batch at
    once, so the two agree to float32 rounding, not bitwise."""
    dataset = open_dataset(data)
    train = dataset.split("train")
    normalize = Normalizer.from_stats(dataset.manifest["stats"], True)
    torch.manual_seed(SEED)
    net = torch_nets.mlp(data_spec(dataset.manifest))
    start = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy().copy()
    np.testing.assert_array_equal(np.load(weights_path(mlp_run, 0)), start)  # version 0: the module's own init
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    plan = Plan(train.rows, BATCH, TASKS, SEED, EPOCHS, shuffle="rows")
    updates = 0
    for epoch in range(EPOCHS):
        for update in plan.updates(epoch):  # the job's default order: train.shuffle = "rows"
            x, y = train[plan.rows(epoch, update.tasks[0].lo, update.tasks[-1].hi)]
            loss = torch.nn.functional.cross_entropy(net(torch.from_numpy(normalize(x))), torch.from_numpy(
                np.array(y)), reduction="sum") / update.rows
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            updates += 1
    expected = torch.cat([p.detach().reshape(-1) for p in net.parameters()]).numpy()
    assert weight_versions(mlp_run)[-1] == updates == 12
    got = last_weights(mlp_run)
    assert np.abs(got - start).max() > 0.1  # it trained
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-6)


# --- determinism, buffers, randomness ---

def test_the_server_alone_and_two_workers_give_bitwise_identical_weights(bn_runs: dict[int, Path]) -> None:
    """With dropout and BatchNorm: the random draws and the buffer means do not depend on the worker count."""
    assert digest(bn_runs[0]) == digest(bn_runs[2])
    events = (bn_runs[2] / "events.log").read_text()
    assert f"torch {torch.__version__}: 1 intra-op thread(s) per worker" in events
    assert "deterministic algorithms on" in events


def test_buffers_become_the_row_weighted_mean_of_each_tasks_updated_buffers(data: Path,
                                                                            bn_runs: dict[int, Path]) -> None:
    """Version 1's running statistics, recomputed by hand: each task of update 0 runs the module in train
    mode on its rows from version 0's buffers; the new buffer is the mean of the results weighted by the
    tasks' rows. num_batches_tracked counts updates. The optimizer (AdamW, weight decay) leaves them alone."""
    run = bn_runs[2]
    dataset = open_dataset(data)
    context = model_context(dataset, "torch", {"factory": "torch_nets:bn_dropout"}, True)
    layout = context.layout
    assert [e.name for e in layout.entries if e.buffer] == ["1.running_mean", "1.running_var",
                                                            "1.num_batches_tracked"]
    v0, v1 = (layout.views(np.load(weights_path(run, v))) for v in (0, 1))
    plan = Plan(dataset.split("train").rows, BATCH, TASKS, SEED, 1, shuffle="rows")  # the job's default order
    update = plan.updates(0)[0]
    means, variances = [], []
    for task in update.tasks:
        net = torch_nets.bn_dropout(context.spec)
        net.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in v0.items()})
        x, _ = dataset.split("train")[plan.rows(0, task.lo, task.hi)]
        net.train()(torch.from_numpy(context.normalize(x)))
        means.append(net[1].running_mean.numpy() * task.rows)
        variances.append(net[1].running_var.numpy() * task.rows)
    np.testing.assert_allclose(v1["1.running_mean"], sum(means) / update.rows, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(v1["1.running_var"], sum(variances) / update.rows, rtol=1e-5, atol=1e-6)
    assert not np.allclose(v1["1.running_mean"], v0["1.running_mean"])
    last = layout.views(last_weights(run))
    assert float(v0["1.num_batches_tracked"]) == 0 and float(last["1.num_batches_tracked"]) == 12


def test_dropout_draws_from_the_task_seed_alone(data: Path) -> None:
    dataset = open_dataset(data)
    context = model_context(dataset, "torch", {"factory": "torch_nets:bn_dropout", "dropout": 0.5}, True)
    layout, model = context.layout, context.model
    weights = layout.flatten(model.init(np.random.default_rng(0)))
    x, y = dataset.split("train").read(0, 50)
    x = context.normalize(x)

    def gradient(seed: tuple[int, int, int]) -> np.ndarray:
        out = np.full(layout.size, np.nan, dtype=np.float32)
        torch.rand(int(seed[2]) + 1)  # whatever the process drew before must not matter
        model.loss_and_grad(layout.views(weights), x, y, layout.views(out), seed=seed)
        return out

    first = gradient((3, 7, 1))
    assert np.isfinite(first).all()
    np.testing.assert_array_equal(gradient((3, 7, 1)), first)
    assert not np.array_equal(gradient((3, 7, 2)), first)  # another task: other dropout masks
    assert not np.array_equal(gradient((3, 8, 1)), first)  # another version
    assert not np.array_equal(gradient((4, 7, 1)), first)  # another job seed


def test_every_binding_variant_gives_the_same_gradient_and_leaves_the_weights_alone(data: Path,
                                                                                     tmp_path: Path) -> None:
    dataset = open_dataset(data)
    context = model_context(dataset, "torch", {"factory": "torch_nets:bn_dropout"}, True)
    layout, model = context.layout, context.model
    path = tmp_path / "w.npy"
    np.save(path, layout.flatten(model.init(np.random.default_rng(1))))
    weights = np.load(path, mmap_mode="r")  # read-only, as a worker maps it
    before = np.array(weights)
    x, y = dataset.split("train").read(0, 60)
    results = {}
    for name, binding in BINDINGS.items():
        model.binding = binding
        out = np.full(layout.size, np.nan, dtype=np.float32)
        loss = model.loss_and_grad(layout.views(weights), context.normalize(x), y, layout.views(out), seed=(1, 2, 3))
        results[name] = (loss, out)
    first_loss, first = results.pop("functional_grad")
    for name, (loss, out) in results.items():
        assert loss == first_loss, name
        np.testing.assert_array_equal(out, first, err_msg=name)
    np.testing.assert_array_equal(weights, before)


def test_a_gradient_task_silences_the_read_only_warning_once_not_per_tensor(data: Path, tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A small module's task paid ``warnings.catch_warnings`` (about 10 us) for each of its tensors: 9 of them for a
    2-layer MLP, a fifth of what memtrain added to its forward and backward passes (docs/torch.md). Now writable
    arrays (the gradient buffer, the rows) take torch.from_numpy directly and the read-only weights are bound
    under one catch_warnings; the gradient is the same bits and torch's warning still never shows."""
    import warnings

    import memtrain.models.torch_bind as torch_bind

    dataset = open_dataset(data)
    context = model_context(dataset, "torch", {"factory": "torch_nets:mlp"}, True)
    layout, model = context.layout, context.model
    path = tmp_path / "w.npy"
    np.save(path, layout.flatten(model.init(np.random.default_rng(1))))
    weights = np.load(path, mmap_mode="r")  # read-only, as a worker maps it
    x, y = dataset.split("train").read(0, 60)
    x = context.normalize(x)
    expected = np.zeros(layout.size, dtype=np.float32)
    expected_loss = model.loss_and_grad(layout.views(weights), x, y, layout.views(expected), seed=(1, 2, 3))
    entered = []
    real = warnings.catch_warnings

    def counted(*args, **kwargs):
        entered.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_bind.warnings, "catch_warnings", counted)
    out = np.zeros(layout.size, dtype=np.float32)
    with real(record=True) as shown:  # the test's own, not counted
        warnings.simplefilter("always")
        loss = model.loss_and_grad(layout.views(weights), x, y, layout.views(out), seed=(1, 2, 3))
    monkeypatch.undo()
    assert len(entered) == 1  # one for the bound weights, none for the gradient views and the rows
    assert not [w for w in shown if "not writable" in str(w.message)]
    assert loss == expected_loss
    np.testing.assert_array_equal(out, expected)

def test_an_evaluation_runs_the_module_once_and_gives_the_bits_of_loss_predict_and_proba(data: Path) -> None:
    """An evaluation task asks for the loss, the predictions and the probabilities of the same rows: one
    forward pass gives all three, bitwise as the three calls do (each of which runs the module)."""
    dataset = open_dataset(data)
    context = model_context(dataset, "torch", {"factory": "torch_nets:bn_dropout"}, True)
    model, params = context.model, context.layout.views(context.layout.flatten(context.model.init(
        np.random.default_rng(2))))
    x, y = dataset.split("val").read(0, 40)
    x = context.normalize(x)
    forwards = []
    hook = model.module.register_forward_hook(lambda *_: forwards.append(1))
    try:
        seen = evaluation(context, params, x, y)
        assert len(forwards) == 1
        apart = (model.loss(params, x, y), model.predict(params, x), model.predict_proba(params, x))
        assert len(forwards) == 4
    finally:
        hook.remove()
    assert seen.loss == apart[0]
    np.testing.assert_array_equal(seen.predicted, apart[1])
    np.testing.assert_array_equal(seen.proba, apart[2])
    np.testing.assert_array_equal(task_statistics(context, params, x, y, predicted=seen.predicted, proba=seen.proba),
                                  task_statistics(context, params, x, y))


def test_frozen_parameters_are_buffers_the_optimizer_never_moves(data: Path) -> None:
    context = model_context(open_dataset(data), "torch", {"factory": "torch_nets:frozen_first_layer"}, True)
    layout = context.layout
    assert [e.name for e in layout.entries] == ["2.weight", "2.bias", "0.weight", "0.bias"]
    assert layout.trainable == 3 * 8 + 3 and [e.buffer for e in layout.entries] == [False, False, True, True]
    assert ParamLayout.from_json(layout.to_json()) == layout


# --- faults: a worker killed, the server killed and resumed ---

def copy_nets(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(TESTS / "torch_nets.py", folder / "torch_nets.py")


def test_worker_killed_mid_run_recovers_bitwise(data: Path, bn_runs: dict[int, Path], tmp_path: Path) -> None:
    copy_nets(tmp_path)  # the factory is found beside the job file (PYTHONPATH holds only memtrain)
    job = write_job(tmp_path, data, "torch_nets:bn_dropout", optimizer="adamw", lr=0.01, train="weight_decay = 0.1")
    result = memtrain_cli("train", job, env={"MEMTRAIN_FAULT": "before_grad_write:4",
                                             "MEMTRAIN_FAULT_ONCE": str(tmp_path / "fired")})
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "fired").exists() and "workers that died and were replaced: 1" in result.stdout
    assert digest(tmp_path / "run") == digest(bn_runs[2])


def test_server_killed_then_resumed_is_bitwise_identical(data: Path, bn_runs: dict[int, Path],
                                                         tmp_path: Path) -> None:
    copy_nets(tmp_path)
    job = write_job(tmp_path, data, "torch_nets:bn_dropout", optimizer="adamw", lr=0.01, train="weight_decay = 0.1")
    # on 1 worker (a process fewer importing torch): its bits are those of 2 (bn_runs)
    crashed = memtrain_cli("train", job, "--workers", 1, env={"MEMTRAIN_FAULT": "after_update_logged:9",
                                                              "MEMTRAIN_FAULT_ONCE": str(tmp_path / "fired")})
    assert crashed.returncode == -9, crashed.stderr
    # resumed in the server (--workers 0): the same bits as on workers, without two more interpreters importing torch
    resumed = memtrain_cli("train", "--resume", tmp_path / "run", "--workers", 0)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed from c" in (tmp_path / "run" / "events.log").read_text()
    assert digest(tmp_path / "run") == digest(bn_runs[2])


# --- errors at start ---

OUTLINED_ERRORS = {"torch_nets:raises", "torch_nets:wrong_width"}  # the errors sent back by the outline's child

@pytest.mark.parametrize(("factory", "extra", "message"), [
    ("torch_nets:raises", "hidden = 7", "model factory 'torch_nets:raises' raised ValueError: no net with 7 hidden"),
    ("torch_nets:wrong_width", "", "the module's output does not fit loss 'cross_entropy' (expected output shape "
                                   "[2, 3] (2 rows x 3 class scores), found output shape [2, 5] for input shape "
                                   "[2, 6], target shape [2])"),
    ("torch_nets:wrong_input", "", "the module fails on 2 rows of the training data: RuntimeError"),
    ("torch_nets:not_a_module", "", "did not return a torch.nn.Module (expected a torch.nn.Module, found dict)"),
    ("torch_nets:integer_parameter", "", "parameters must be real floating point (trained as float32) (expected "
                                         "float16, bfloat16, float32 or float64, found counts of dtype torch.int64)"),
    ("torch_nets:lazy", "", "lazy modules have no shapes before their first forward pass"),
    ("torch_nets:tied", "", "tied weights) are not supported (expected one tensor per parameter name, found "
                            "1.weight shared with another parameter)"),
    ("torch_nets:mlp", 'loss = "torch_nets:summed_loss"', "loss 'torch_nets:summed_loss' must return one loss per "
                                                          "row (expected a tensor of shape [2], found shape []"),
    ("torch_nets:missing", "", "module 'torch_nets' has no 'missing' (the model factory)"),
    ("no_such_module:make", "", "cannot import module 'no_such_module' of model factory 'no_such_module:make'"),
    ("torch_nets:mlp", 'loss = "hinge"', "unknown model.loss (expected cross_entropy or mse, or 'module:fn', "
                                         "found 'hinge')"),
])
def test_a_module_that_cannot_train_fails_at_start_naming_factory_and_shapes(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], factory: str, extra: str,
        message: str) -> None:
    """The job's 2 workers have the module outlined in a child process (train/server/outline.py), which sends its
    error back: a factory's (raises) and a dry run's (wrong_width) take that path; the other cases build the module
    in the server (--workers 0), where the same code words the error, without a child importing torch (~1 s each)."""
    job = write_job(tmp_path, data, factory, model=extra)
    code = main(["train", str(job), *(() if factory in OUTLINED_ERRORS else ("--workers", "0"))])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()  # refused before any run directory or worker


def test_a_custom_loss_gets_output_and_target_and_its_per_row_losses_are_summed(data: Path) -> None:
    dataset = open_dataset(data)
    x, y = dataset.split("train").read(0, 40)
    gradients = {}
    for loss in ("cross_entropy", "torch_nets:per_row_loss"):  # per_row_loss: 2 x cross-entropy
        context = model_context(dataset, "torch", {"factory": "torch_nets:mlp", "loss": loss}, True)
        weights = context.layout.flatten(context.model.init(np.random.default_rng(0)))
        out = np.empty(context.layout.size, dtype=np.float32)
        value = context.model.loss_and_grad(context.layout.views(weights), context.normalize(x), y,
                                            context.layout.views(out))
        gradients[loss] = (value, out)
    (plain, grad), (doubled, grad2) = gradients.values()
    assert doubled == pytest.approx(2 * plain, rel=1e-6)
    np.testing.assert_allclose(grad2, 2 * grad, rtol=1e-6, atol=1e-7)


def test_without_torch_a_torch_job_fails_at_start_with_the_install_hint(
        data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    code = main(["train", str(write_job(tmp_path, data, "torch_nets:mlp"))])
    err = capsys.readouterr().err
    assert code == 2
    assert "model kind 'torch' needs PyTorch, which is not installed" in err
    assert 'pip install "memtrain[torch]"' in err and "torch==2.13.0" in err


# --- using the result ---

def test_load_model_module_and_safetensors_export_predict_like_training_on_raw_rows(
        data: Path, mlp_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    trained = memtrain.load_model(mlp_run)
    module = trained.module
    assert isinstance(module, torch.nn.Module) and not module.training
    np.testing.assert_array_equal(module[0].weight.detach().numpy().reshape(-1),
                                  last_weights(mlp_run)[:module[0].weight.numel()])
    out = tmp_path / "model.safetensors"
    assert main(["inspect", str(mlp_run), "--export", str(out)]) == 0
    assert "normalization: written" in capsys.readouterr().out
    fresh = torch_nets.mlp(trained.context.spec)
    fresh.load_state_dict(load_file(out), strict=True)
    with safe_open(out, "pt") as handle:
        meta = handle.metadata()
    mean, std = (np.array(json.loads(meta[f"memtrain.normalize.{k}"]), dtype=np.float32) for k in ("mean", "std"))
    assert json.loads(meta["memtrain_meta"])["model"]["options"]["factory"] == "torch_nets:mlp"
    dataset = open_dataset(data)
    raw, labels = dataset.split("val").read(0, dataset.split("val").rows)
    raw = np.asarray(raw)
    assert np.abs(raw.mean(0)).max() > 1  # raw features: the normalization matters
    with torch.no_grad():
        exported = fresh.eval()(torch.from_numpy((raw - mean) / std)).argmax(1).numpy()
    np.testing.assert_array_equal(exported, trained.predict(raw))
    assert (exported == labels).mean() > 0.9
    proba = trained.predict_proba(raw)
    np.testing.assert_allclose(proba.sum(1), 1, rtol=1e-5)
    np.testing.assert_array_equal(proba.argmax(1), exported)


def test_regression_trains_on_mse_and_predicts_in_the_targets_shape(tmp_path: Path) -> None:
    x, _ = blobs(n=300, features=4, classes=2, seed=4)
    y = (x @ np.array([0.5, -1.0, 0.25, 2.0], dtype=np.float32) + 3).astype(np.float32)
    data = write_dataset(tmp_path / "reg", x, y, task="regression", shard_rows=300)
    dataset = open_dataset(data)
    context = model_context(dataset, "torch", {"factory": "torch_nets:regressor"}, True)
    model, layout = context.model, context.layout
    assert model.criterion.name == "mse"  # the regression default
    train = dataset.split("train")
    rows, targets = train.read(0, train.rows)
    assert "torch" in model.startup(context.normalize(rows[:2]), targets[:2], 1)
    weights = layout.flatten(model.init(np.random.default_rng(0)))
    grad = np.empty(layout.size, dtype=np.float32)
    before = model.loss(layout.views(weights), context.normalize(rows), targets)
    for _ in range(30):  # plain gradient descent on the mean loss, through the protocol
        model.loss_and_grad(layout.views(weights), context.normalize(rows), targets, layout.views(grad))
        weights -= 0.01 * grad / train.rows
    after = model.loss(layout.views(weights), context.normalize(rows), targets)
    assert after < 0.5 * before
    assert model.predict(layout.views(weights), context.normalize(rows[:5])).shape == (5,)
    wrong = model_context(dataset, "torch", {"factory": "torch_nets:wrong_width"}, True)  # 2 outputs
    with pytest.raises(memtrain.errors.InputError, match=r"does not fit loss 'mse' \(expected output shape \[2, 1\]"):
        wrong.model.startup(context.normalize(rows[:2]), targets[:2], 1)


# --- the server when workers compute ---

PROBE = """
import sys
from memtrain.cli import main
code = main(["train", *sys.argv[1:], "--quiet"])
print("torch in the server:", sorted(name for name in sys.modules if name.split(".")[0] == "torch")[:3])
sys.exit(code)
"""


# [new] is kept out of CI for time (-m slow: a server, its outline's child and 2 workers importing torch):
# [resume-of-nothing] takes the same path with 2 workers (the model outlined in a child, the server without torch),
# and test_worker_killed_mid_run_recovers_bitwise a new run's outline with version 0 (its bits those of bn_runs[2]).
@pytest.mark.parametrize(("workers", "resume"), [pytest.param("2", (), marks=pytest.mark.slow),
                                                 ("2", ("--resume",)), ('"auto"', ())],
                         ids=["new", "resume-of-nothing", "auto"])
def test_a_server_whose_workers_compute_never_imports_torch(data: Path, bn_runs: dict[int, Path], tmp_path: Path,
                                                            workers: str, resume: tuple[str, ...]) -> None:
    """With train.workers = 2 the server steps a flat vector: the module's layout, version 0 and dry run come
    from a short child process (train/server/outline.py), so the server never imports torch; the bits are unchanged.
    A --resume that finds no run starts afresh: the outline, made without version 0, builds it then.
    With "auto" (2 cores, 3 tasks per update) the child is kept and runs the rounds the server would have run,
    timed there: the server imports no torch either, and the bits are those of 2 workers."""
    copy_nets(tmp_path)
    job = write_job(tmp_path, data, "torch_nets:bn_dropout", optimizer="adamw", lr=0.01, train="weight_decay = 0.1")
    job.write_text(job.read_text().replace("workers = 2", f"workers = {workers}"))
    result = subprocess.run([sys.executable, "-c", PROBE, str(job), *resume], capture_output=True, text=True,
                            timeout=200, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert "torch in the server: []" in result.stdout
    events = (tmp_path / "run" / "events.log").read_text()
    if workers == "2":
        assert "rounds: on 2 worker processes" in events
    else:
        assert "rounds: timed on 1 worker process" in events and "the process that outlined the model" in events
        assert "rounds: on 1 worker from update 12" in events  # another worker cannot pay: the probe
        # needs 6 updates timed, 5 per 6-update epoch, so it decides with none left
    assert digest(tmp_path / "run") == digest(bn_runs[2])
