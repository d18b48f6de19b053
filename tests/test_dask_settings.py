"""The Dask settings of the clusters memtrain starts (memtrain/cluster/dask_settings.py; issue 42's scheduler CPU).

An idle scheduler's CPU per second was 14.5 ms with one worker and 21.5 with eight (Dask's event-loop ticks every
20 ms, worker heartbeats every 0.5 s each); memtrain's own `local:N` and Slurm clusters turn down what it does not
use. These tests check each setting reaches the processes it must: a `local:N` cluster's scheduler (in the
server's process) and its workers (through their nannies), and a scheduler and workers started as the Slurm
launch starts them (the environment, the scheduler's preload).
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("distributed")

import distributed.scheduler  # noqa: E402
from distributed import Client  # noqa: E402

from benchmarks.cluster_parts import external_cluster  # noqa: E402
from memtrain.cluster import dask_settings, slurm  # noqa: E402
from memtrain.cluster.address import parse_cluster  # noqa: E402
from memtrain.cluster.connect import connected  # noqa: E402
from memtrain.cluster.dask_settings import HEARTBEAT_SECONDS, SETTINGS, environment, variable  # noqa: E402

TICK = variable("distributed.admin.tick.interval")


def settings_seen(client: Client) -> dict[str, Any]:
    """What the scheduler and the workers run with: stealing, the memory manager, ticks, heartbeats (ms)."""
    def scheduler(dask_scheduler: Any) -> dict[str, Any]:
        amm = dask_scheduler.extensions.get("amm")
        return {"stealing": "stealing" in dask_scheduler.extensions, "amm": bool(amm and amm.running),
                "tick": dask_scheduler._tick_interval}

    deadline = time.monotonic() + 20
    while True:  # a worker takes the scheduler's heartbeat interval from the answer to its first heartbeat (1 s)
        beats = client.run(lambda dask_worker: dask_worker.periodic_callbacks["heartbeat"].callback_time)
        ticks = client.run(lambda dask_worker: dask_worker._tick_interval)
        if all(ms != 1000 for ms in beats.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    return {**client.run_on_scheduler(scheduler), "heartbeat_ms": sorted(set(beats.values())),
            "worker_ticks": sorted(set(ticks.values()))}


TURNED_DOWN = {"stealing": False, "amm": False, "tick": 0.5, "heartbeat_ms": [HEARTBEAT_SECONDS * 1000],
               "worker_ticks": [0.5]}


def test_a_local_cluster_runs_with_dasks_background_turned_down(monkeypatch) -> None:
    monkeypatch.delenv(TICK, raising=False)  # the suite's own setting (conftest.py): memtrain's must do it alone
    import dask

    dask.config.refresh()
    try:
        with connected(parse_cluster("local:2")) as client:
            assert settings_seen(client) == TURNED_DOWN
            assert distributed.scheduler.heartbeat_interval(2) == HEARTBEAT_SECONDS
        assert distributed.scheduler.heartbeat_interval(2) == 0.5  # Dask's own rule again once the cluster closed
        assert dask.config.get("distributed.scheduler.work-stealing") is True  # the process's configuration too
    finally:
        monkeypatch.undo()
        dask.config.refresh()


def test_a_scheduler_and_workers_started_as_the_slurm_launch_starts_them_run_with_it(tmp_path: Path,
                                                                                     monkeypatch) -> None:
    monkeypatch.delenv(TICK, raising=False)
    with external_cluster(2, tmp_path) as (address, _), Client(address, timeout=30) as client:
        client.wait_for_workers(2, timeout=60)
        assert settings_seen(client) == TURNED_DOWN


def test_the_slurm_launch_hands_its_dask_processes_the_settings_and_the_users_own_win(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    started: list[tuple[list[str], dict[str, str]]] = []
    monkeypatch.setattr(subprocess, "Popen", lambda command, **options: started.append((command, options["env"])))
    monkeypatch.delenv(TICK, raising=False)
    monkeypatch.setenv(variable("distributed.scheduler.work-stealing"), "True")
    slurm._spawn([*slurm.SCHEDULER, "--port", "0"], tmp_path)
    (_, env), = started
    assert env[TICK] == "500ms"
    assert env[variable("distributed.scheduler.active-memory-manager.start")] == "False"
    assert env[variable("distributed.scheduler.work-stealing")] == "True"  # set by the user: kept
    source = Path(slurm.__file__).read_text()
    assert '"--preload", "memtrain.cluster.dask_settings"' in source  # rank 0's scheduler (serve)


def test_the_heartbeat_rule_is_never_below_memtrains_nor_dasks() -> None:
    rule = dask_settings.slower(dask_settings.dask_rule())
    for workers in (1, 10, 11, 49, 50, 199, 200, 2048):
        assert rule(workers) == max(HEARTBEAT_SECONDS, dask_settings.dask_rule()(workers))
    assert rule(2048) > HEARTBEAT_SECONDS  # Dask's rule past 1,000 workers (n / 200 + 1 s) is kept


def test_the_environment_names_each_setting_as_dask_reads_it() -> None:
    import dask

    env = environment({})
    assert set(env) == {variable(key) for key in SETTINGS}
    collected = dask.config.collect_env(env)
    for key, value in SETTINGS.items():
        assert dask.config.get(key, config=collected) == value, key
    assert environment({TICK: "1s"}).get(TICK) is None
    assert os.environ.get(TICK) is None or TICK not in environment()
