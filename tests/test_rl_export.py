"""Exports of a reinforcement-learning run, as for every model (issue 40): ``memtrain inspect RUN --export
OUT.npz|OUT.h5|OUT.safetensors`` (``--which best|last``) writes the policy's named arrays -- the numpy
actor-critic's layers, a torch actor-critic's state_dict keys -- through the supervised export's code; the summary
view shows the best checkpoint by evaluation; ``--diff`` compares two runs' policies. End to end through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_rl_best import JOB  # its run: the greedy evaluation peaks at version 14 of 20 (a best-only checkpoint)

import memtrain
from memtrain.cli import main
from memtrain.files import open_npy
from memtrain.rl.act import Actor

pytest.importorskip("gymnasium")
pytestmark = pytest.mark.timeout(300)

EXAMPLES = Path(__file__).resolve().parent.parent / "jobs" / "examples"
TORCH_JOB = f"""[env]
id = "CartPole-v1"
slots = 2
steps = 16
[model]
kind = "torch"
factory = "rl_nets:make_actor_critic"
code_dir = "{EXAMPLES}"
hidden = 8
[train]
algorithm = "a2c"
env_steps = 128
lr = 0.01
seed = 3
workers = 0
[run]
dir = "run"
"""


def train(folder: Path, job: str = JOB, *args: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.toml").write_text(job)
    assert main(["train", str(folder / "job.toml"), "-q", *args]) == 0
    return folder / "run"


def inspect(capsys, *args: str) -> dict:
    capsys.readouterr()
    assert main(["inspect", *map(str, args), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def weights(run: Path, version: int) -> np.ndarray:
    return np.array(open_npy(run / "checkpoints" / f"c{version:08d}" / "weights.npy"))


def test_an_rl_runs_best_and_last_checkpoints_export_to_every_format_and_act_the_same(tmp_path: Path,
                                                                                       capsys) -> None:
    run = train(tmp_path / "a")
    view = inspect(capsys, run)
    best = memtrain.load_model(run, which="best")
    assert view["best"] == {"version": 14, "eval_return_mean": view["best"]["eval_return_mean"], "checkpoint": True}
    assert view["best"]["eval_return_mean"] == max(r["eval_return_mean"] for r in view["versions"]
                                                   if r["eval_return_mean"] is not None)
    capsys.readouterr()
    assert main(["inspect", str(run)]) == 0
    assert f"version 14: greedy return {view['best']['eval_return_mean']:g} (its checkpoint kept)" in \
        capsys.readouterr().out.replace("\n", " ")
    names = list(best.policy.layout.views(best.weights))
    assert names[:2] == ["pi.0.w", "pi.0.b"]
    observations = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
    for version, out, which in ((14, tmp_path / "best.npz", ()), (14, tmp_path / "best.h5", ("--which", "best")),
                                (20, tmp_path / "last.safetensors", ("--which", "last"))):
        written = inspect(capsys, run, "--export", out, *which)
        assert [a["name"] for a in written["arrays"]] == names and written["normalization"].startswith("none")
        arrays = read_export(out)
        expected = best.policy.layout.views(weights(run, version))
        assert sorted(arrays) == sorted(names) and all(np.array_equal(arrays[n], expected[n]) for n in names)
        flat = np.concatenate([arrays[n].reshape(-1) for n in names])
        loaded = memtrain.load_model(run, which="best" if version == 14 else "last")
        assert np.array_equal(Actor(best.policy, flat).act(observations), loaded.act(observations))
    assert not np.array_equal(weights(run, 14), weights(run, 20))
    # --diff of two runs (another seed) and of a run with itself: the policy's named arrays, layer by layer
    other = train(tmp_path / "b", JOB, "--set", "train.seed=5")
    diff = inspect(capsys, run, "--diff", other)
    assert [row["name"] for row in diff["params"]] == names and diff["total"]["max_abs_diff"] > 0
    assert inspect(capsys, run, "--diff", run / "checkpoints" / "c00000020")["total"]["max_abs_diff"] == 0
    # a run that evaluated nothing: --which best is a clear error, the default exports the newest
    never = train(tmp_path / "c", JOB, "--set", "train.eval_every=0")
    assert inspect(capsys, never)["best"] is None
    assert main(["inspect", str(never), "--export", str(tmp_path / "x.npz"), "--which", "best"]) != 0
    assert "the run records no best evaluation (found train.eval_every = 0)" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()
    inspect(capsys, never, "--export", tmp_path / "never.npz")
    assert np.array_equal(read_export(tmp_path / "never.npz")["v.out.b"],
                          best.policy.layout.views(weights(never, 20))["v.out.b"])


def test_a_torch_actor_critics_export_loads_into_the_module_by_its_state_dict_keys(tmp_path: Path,
                                                                                      capsys) -> None:
    import torch
    from safetensors.torch import load_file

    run = train(tmp_path / "t", TORCH_JOB)
    actor = memtrain.load_model(run)
    out = tmp_path / "policy.safetensors"
    inspect(capsys, run, "--export", out)
    module = actor.policy.module
    fresh = type(module)(4, 2, "discrete", hidden=8)
    assert set(load_file(out)) == set(fresh.state_dict())
    fresh.load_state_dict(load_file(out), strict=True)
    observations = np.random.default_rng(1).normal(size=(32, 4)).astype(np.float32)
    with torch.no_grad():
        logits, _ = fresh(torch.from_numpy(observations))
    assert np.array_equal(logits.argmax(dim=1).numpy(), actor.act(observations))
    with torch.no_grad():
        mine = actor.policy.forward(actor.weights, observations)
    assert np.array_equal(mine.out, logits.numpy())


def read_export(out: Path) -> dict[str, np.ndarray]:
    if out.suffix == ".npz":
        with np.load(out, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    if out.suffix == ".h5":
        import h5py

        with h5py.File(out, "r") as handle:
            return {name: handle[name][()] for name in handle}  # (h5py lists names sorted)
    from safetensors.numpy import load_file

    return load_file(out)
