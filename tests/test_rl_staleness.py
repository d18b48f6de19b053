"""Fixed staleness 1 in `memtrain train` of a reinforcement-learning job (DPPO's kept buffers, docs/rl.md): version
v collects while the learner updates on the shards collected with v - 1. The same weight bits for 0, 1, 2 and 4
workers and as the single-process reference loop with ``staleness = 1``; the lineage names the version each
shard was collected with; the update runs while the collection tasks are out; a server SIGKILL then `--resume`
(the kept shards come back from the checkpoint) ends on the uninterrupted run's bits, lineage and metrics."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from test_rl_faults import job as fault_job
from test_rl_faults import lineage_checksums, memtrain, weights
from test_rl_train import JOB, VERSIONS, final_weights, write_job

import memtrain.rl.server as server
from memtrain.cli import main
from memtrain.files import read_jsonl, read_sealed_jsonl
from memtrain.layout import RUN_EVENTS, RUN_LINEAGE, RUN_METRICS
from memtrain.rl.envs import EnvSpec
from memtrain.rl.ppo import PPOConfig
from memtrain.rl.reference import ReferenceConfig
from memtrain.rl.reference import train as reference_train
from memtrain.rl.server import checkpoint_dir, checkpoints
from memtrain.rl.trajectory import shard_path

pytestmark = pytest.mark.timeout(300)
STALE = JOB.replace("workers = 0\n", "workers = 0\nstaleness = 1\n")
LAST = VERSIONS + 1  # one more version: the update on the last collection's shards


def test_staleness_1_gives_the_same_bits_for_0_1_2_and_4_workers_and_the_reference_loop(tmp_path: Path,
                                                                                          capsys) -> None:
    job = write_job(tmp_path, STALE)
    bits = {}
    for workers in (0, 1, 2, 4):
        run = tmp_path / f"w{workers}"
        assert main(["train", str(job), "--workers", str(workers), "--run-dir", str(run)]) == 0
        out = capsys.readouterr().out
        assert f"done: {VERSIONS} versions (1,280 env steps), weight version {LAST}" in out
        bits[workers] = final_weights(run, LAST)
    assert len(set(bits.values())) == 1
    config = ReferenceConfig(EnvSpec(id="CartPole-v1"), env_steps=1280, slots=4, steps=32, seed=3, hidden=(16, 16),
                             lr=2.5e-4, adam_eps=1e-5, learner=PPOConfig(epochs=2, minibatches=2, ent_coef=0.01),
                             staleness=1)
    reference, history = reference_train(config, tmp_path / "reference")
    assert reference.tobytes() == bits[0]
    fresh, _ = reference_train(ReferenceConfig(**{**config.__dict__, "staleness": 0}), tmp_path / "fresh")
    assert fresh.tobytes() != bits[0]  # the kept shards are learned one version late: another run
    episodes = [float(r) for m in read_jsonl(tmp_path / "w2" / RUN_METRICS) for r in m["episode_returns"]]
    assert episodes == [float(r) for returns in history.returns for r in returns]  # the same episodes, continued


def test_the_lineage_names_the_version_each_kept_shard_was_collected_with(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", str(write_job(tmp_path, STALE)), "-q"]) == 0
    lineage, damaged = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage record")
    assert not damaged and [r["version"] for r in lineage] == list(range(LAST + 1))
    assert lineage[1]["shards"] == [] and lineage[1]["optimizer_steps"] == 0  # nothing collected before version 0
    assert lineage[1]["checksum"] == lineage[0]["checksum"]
    for record in lineage[2:]:
        assert record["parent"] == record["version"] - 1 and record["optimizer_steps"] == 2 * 2
        assert [(s["slot"], s["version"]) for s in record["shards"]] == [(e, record["version"] - 2) for e in range(4)]
    metrics = read_jsonl(run / RUN_METRICS)
    assert [m["version"] for m in metrics] == list(range(LAST))
    assert [m["learned_from"] for m in metrics] == [None, *range(VERSIONS)]
    assert {m["policy_lag"] for m in metrics[1:]} == {1}
    assert [m["env_steps"] for m in metrics] == [128] * VERSIONS + [0]
    assert not list((run / "trajectories").iterdir())  # every kept shard was learned from, then removed
    capsys.readouterr()
    assert main(["inspect", str(run), "--json"]) == 0
    progress = __import__("json").loads(capsys.readouterr().out)["progress"]
    assert progress == {"versions_done": LAST, "versions": LAST, "env_steps_done": 1280}


def test_the_update_on_the_kept_shards_runs_while_the_collection_tasks_are_out(tmp_path: Path, monkeypatch) -> None:
    """The update runs in a thread beside the dispatch, started before the version's tasks go out (a small update
    may be done before the first task is sent: the test asks that it began before the tasks were all back)."""
    import threading
    import time

    runs, learns = [], []
    run, learn = server.Scheduler.run, server.learn

    def scheduler_run(self, transport, tasks, while_waiting=None):
        began = time.monotonic()
        try:
            return run(self, transport, tasks, while_waiting)
        finally:
            runs.append((began, time.monotonic()))

    def recorded_learn(*args, **kwargs):
        began = time.monotonic()
        try:
            return learn(*args, **kwargs)
        finally:
            learns.append((began, time.monotonic(), threading.current_thread() is threading.main_thread()))

    monkeypatch.setattr(server.Scheduler, "run", scheduler_run)
    monkeypatch.setattr(server, "learn", recorded_learn)
    assert main(["train", str(write_job(tmp_path, STALE)), "-q", "--workers", "2"]) == 0
    assert len(runs) == VERSIONS and len(learns) == VERSIONS and not any(main for *_, main in learns)
    for (_, run_ended), (learn_began, *_) in zip(runs[1:], learns, strict=False):
        assert learn_began < run_ended  # version v's update under way before v + 1's tasks are all back
    runs.clear()
    learns.clear()
    assert main(["train", str(write_job(tmp_path / "sync")), "-q", "--workers", "2"]) == 0
    assert all(main for *_, main in learns)  # staleness 0 learns from what it just collected, in the server
    assert all(learn_began >= run_ended for (_, run_ended), (learn_began, *_) in zip(runs, learns, strict=True))


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("clean")
    result = memtrain("train", fault_job(folder), "-q", "--set", "train.staleness=1", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder / "run"


def test_a_server_killed_then_resumed_with_kept_shards_ends_on_the_uninterrupted_bits(tmp_path: Path,
                                                                                       clean: Path) -> None:
    killed = memtrain("train", fault_job(tmp_path, workers=2), "-q", "--set", "train.staleness=1", cwd=tmp_path,
                      MEMTRAIN_FAULT="rl_after_publish:5")
    assert killed.returncode == -signal.SIGKILL
    run = tmp_path / "run"
    assert checkpoints(run) == [3, 4]  # 4: its evaluation the best so far, a best-only checkpoint (run.keep_best)
    kept = sorted(p.name for p in checkpoint_dir(run, 4).iterdir() if p.name.startswith("r-"))
    assert kept == [shard_path(run, 3, slot).name for slot in range(4)]  # version 3's shards, learned at 4
    for slot in range(4):  # what the resume must not read: the live folder's copies
        shard_path(run / "trajectories", 3, slot).unlink(missing_ok=True)
    resumed = memtrain("train", "--resume", run, "-q", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert weights(run, 13) == weights(clean, 13)
    assert lineage_checksums(run) == lineage_checksums(clean)
    metrics, uninterrupted = read_jsonl(run / RUN_METRICS), read_jsonl(clean / RUN_METRICS)
    for key in ("version", "episode_returns", "return_last100_mean", "approx_kl", "learned_from", "eval_return_mean"):
        assert [m.get(key) for m in metrics] == [m.get(key) for m in uninterrupted], key
    assert "resumed at weight version 4" in (run / RUN_EVENTS).read_text()


def test_a_checkpoint_without_its_kept_shards_is_skipped_not_resumed_from(tmp_path: Path, clean: Path) -> None:
    result = memtrain("train", fault_job(tmp_path), "-q", "--set", "train.staleness=1", cwd=tmp_path,
                      MEMTRAIN_FAULT="rl_after_publish:8")
    assert result.returncode == -signal.SIGKILL
    run = tmp_path / "run"
    assert checkpoints(run) == [3, 4, 6]  # 4: the best evaluation's
    shard = checkpoint_dir(run, 6) / shard_path(run, 5, 1).name
    data = bytearray(shard.read_bytes())
    data[-40] ^= 1
    shard.write_bytes(bytes(data))
    resumed = memtrain("train", "--resume", run, "-q", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "checkpoint c00000006 skipped" in (run / RUN_EVENTS).read_text()
    assert "resumed at weight version 4" in (run / RUN_EVENTS).read_text()
    assert weights(run, 13) == weights(clean, 13)


def test_the_dppo_example_runs_with_staleness_1(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "jobs" / "examples" / "cartpole-dppo.toml"
    assert main(["train", str(example), "--run-dir", str(tmp_path / "run"), "--set", "train.env_steps=1280",
                 "--set", "train.eval_every=5", "--set", "train.eval_episodes=1", "-q"]) == 0
    lineage, _ = read_sealed_jsonl(tmp_path / "run" / RUN_LINEAGE, what="lineage record")
    assert len(lineage) == 1280 // 256 + 2 and lineage[-1]["shards"][0]["version"] == 1280 // 256 - 1
