"""`train.mode = "async"` of a reinforcement-learning run (memtrain/rl/asynchronous.py, docs/rl.md): workers
collect with the newest version, the shards are applied in arrival order (one per version), a shard older than
`train.max_policy_lag` is collected again and never trained on, and `memtrain train --replay RUN` re-executes the
recorded order bit for bit; A3C (async A2C) applies each task's own gradient exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_rl_train import JOB, VERSIONS, final_weights, write_job

from memtrain.cli import main
from memtrain.files import publish, read_jsonl, read_sealed_jsonl, seal
from memtrain.layout import RUN_EVENTS, RUN_LINEAGE, RUN_METRICS

pytestmark = pytest.mark.timeout(300)
ASYNC = JOB.replace("workers = 0\n", 'workers = 2\nmode = "async"\n')
UPDATES = VERSIONS * 4  # one shard per version
EXAMPLES = Path(__file__).resolve().parent.parent / "jobs" / "examples"


def lineage(run: Path) -> list[dict]:
    records, damaged = read_sealed_jsonl(run / RUN_LINEAGE, what="lineage record")
    assert not damaged
    return records


def applied(run: Path) -> list[tuple[int, int, int]]:
    """(version, slot, collected at) of every applied shard, in order."""
    return [(r["version"], r["shards"][0]["slot"], r["shards"][0]["version"]) for r in lineage(run)[1:]]


def test_an_async_run_is_replayed_bit_for_bit(tmp_path: Path, capsys) -> None:
    run, again = tmp_path / "run", tmp_path / "again"
    assert main(["train", str(write_job(tmp_path, ASYNC)), "-q"]) == 0
    assert "weight version 40" in capsys.readouterr().out
    assert main(["train", "--replay", str(run), "--run-dir", str(again), "-q"]) == 0
    assert f"replayed {run}: all {UPDATES} weight versions match the recorded checksums" in capsys.readouterr().out
    assert final_weights(again, UPDATES) == final_weights(run, UPDATES)
    assert [r["checksum"] for r in lineage(again)] == [r["checksum"] for r in lineage(run)]
    assert applied(again) == applied(run)
    assert main(["inspect", str(run), "--json"]) == 0
    progress = __import__("json").loads(capsys.readouterr().out)["progress"]
    assert progress == {"versions_done": UPDATES, "versions": UPDATES, "env_steps_done": 1280}


def test_every_applied_shard_is_within_the_lag_bound_and_a_staler_one_is_collected_again(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert main(["train", str(write_job(tmp_path, ASYNC)), "--set", "train.max_policy_lag=0", "-q"]) == 0
    shards = applied(run)
    assert len(shards) == UPDATES and all(version - 1 - collected == 0 for version, _, collected in shards)
    per_slot = [sum(1 for _, slot, _ in shards if slot == e) for e in range(4)]
    assert sum(per_slot) == UPDATES  # the budget's shards, each applied once
    events = (run / RUN_EVENTS).read_text()
    rejected = events.count("collected again")
    assert rejected > 0  # two workers at lag 0: one of each pair arrives a version late
    metrics = read_jsonl(run / RUN_METRICS)
    assert sum(m["collected_again"] for m in metrics) == rejected
    assert {m["policy_lag"] for m in metrics} == {0}
    for slot in range(4):  # each slot's episodes continue through its applied shards only
        ends = [m for m in metrics if m["slot"] == slot]
        assert len(ends) == per_slot[slot]


def test_a_replay_that_differs_names_the_version_and_a_sync_run_is_refused(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    assert main(["train", str(write_job(tmp_path, ASYNC)), "-q"]) == 0
    records = lineage(run)
    records[7]["checksum"] = "xxh3-128-blocks:" + "0" * 32
    text = "".join(__import__("json").dumps(seal({k: v for k, v in r.items() if k != "record_checksum"})) + "\n"
                   for r in records)
    publish(run / RUN_LINEAGE, lambda handle: handle.write(text.encode()), durable=False)
    capsys.readouterr()
    assert main(["train", "--replay", str(run), "-q"]) == 1
    err = capsys.readouterr().err
    assert "differs from the run at weight version 7" in err and "Traceback" not in err
    assert main(["train", str(write_job(tmp_path / "sync")), "-q"]) == 0
    assert main(["train", "--replay", str(tmp_path / "sync" / "run"), "-q"]) == 2
    assert "this run is synchronous" in capsys.readouterr().err


def test_a3c_applies_each_tasks_gradient_once_and_replays(tmp_path: Path, capsys) -> None:
    run, again = tmp_path / "run", tmp_path / "again"
    assert main(["train", str(EXAMPLES / "cartpole-a3c.toml"), "--run-dir", str(run), "--set", "train.env_steps=800",
                 "--set", "train.eval_every=2", "--set", "train.eval_episodes=1", "-q"]) == 0
    records = lineage(run)
    assert {r["optimizer_steps"] for r in records[1:]} == {1}  # one gradient per version
    pairs = [(r["shards"][0]["slot"], r["shards"][0]["version"]) for r in records[1:]]
    assert len(pairs) == len(set(pairs)) == 800 // 5  # every task's gradient applied exactly once
    assert all(r["policy_lag"] <= 4 for r in records[1:])
    assert not [p for p in (run / "trajectories").iterdir()]  # no shard or gradient left behind
    assert main(["train", "--replay", str(run), "--run-dir", str(again), "-q"]) == 0
    assert final_weights(again, len(pairs)) == final_weights(run, len(pairs))


def test_an_async_run_killed_and_resumed_replays_bit_for_bit(tmp_path: Path) -> None:
    from test_rl_faults import memtrain

    path = write_job(tmp_path, ASYNC.replace('dir = "run"', 'dir = "run"\ncheckpoint_every = 2'))
    killed = memtrain("train", path, "-q", cwd=tmp_path, MEMTRAIN_FAULT="rl_after_publish:13")
    assert killed.returncode == -9, killed.stderr
    run = tmp_path / "run"
    resumed = memtrain("train", "--resume", run, "-q", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at weight version 8" in (run / RUN_EVENTS).read_text()  # every 2 x 4 slots versions
    assert [r["version"] for r in lineage(run)] == list(range(UPDATES + 1))
    replayed = memtrain("train", "--replay", run, "--run-dir", tmp_path / "again", "-q", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    assert final_weights(tmp_path / "again", UPDATES) == final_weights(run, UPDATES)


def test_sigterm_stops_an_async_run_with_a_checkpoint_and_its_record_replays(tmp_path: Path) -> None:
    import signal
    import time

    from test_rl_faults import memtrain

    path = write_job(tmp_path, ASYNC.replace("env_steps = 1280", "env_steps = 64000"))
    process = memtrain("train", path, "-q", cwd=tmp_path, wait=False)
    metrics, deadline = tmp_path / "run" / RUN_METRICS, time.monotonic() + 120
    while time.monotonic() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 30):
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, err
    stopped_at = int(err.split("stopped by SIGTERM at weight version ")[1].split(";")[0])
    run = tmp_path / "run"
    replayed = memtrain("train", "--replay", run, "--run-dir", tmp_path / "again", "-q", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    assert f"all {stopped_at} weight versions match" in replayed.stdout
    assert final_weights(tmp_path / "again", stopped_at) == final_weights(run, stopped_at)
