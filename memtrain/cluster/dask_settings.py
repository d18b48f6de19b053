"""The Dask settings of the clusters memtrain starts itself (``--cluster local:N``, ``--cluster slurm``; issue 42).

An idle Dask scheduler spends CPU every second on work memtrain does not use, and part of it grows with the
workers. A round's scheduler CPU per update is its own part (flat in the nodes) plus that background times the
update's wall time, so the background must be small for the whole to be flat (docs/cluster.md, "Dask's
background, turned down"). In the processes memtrain starts, it turns off or slows what it does not use:

- ``distributed.admin.tick.interval`` 20 ms -> 500 ms: every Dask process checks its event loop's latency at
  this rate, only to warn when the loop was blocked (the largest part of an idle scheduler's CPU);
- ``distributed.scheduler.work-stealing`` off: memtrain pins each of its actors and tasks to a worker (the
  round's members, the pool's actors), so there is nothing to steal, but stealing still runs per task transition
  and once a second;
- ``distributed.scheduler.active-memory-manager.start`` off: memtrain keeps no data in Dask's memory (its
  data goes through files), so there are no replicas to manage;
- **worker heartbeats** every ``HEARTBEAT_SECONDS`` at least: Dask's scheduler tells each worker how often to
  report (``distributed.scheduler.heartbeat_interval``: every 0.5 s up to 10 workers, then 1 s, 2 s, ...: a
  cost per worker per second) and has no setting for it. memtrain does not learn anything from heartbeats (a
  lost worker is seen when its connection drops, a silent one by ``train.task_timeout``; Dask's own
  ``worker-ttl``, 5 minutes, is far above), so in its schedulers the rule is replaced by one never below
  ``HEARTBEAT_SECONDS`` (``slower_heartbeats``; a scheduler started by hand can load it with
  ``dask scheduler --preload memtrain.cluster.dask_settings``).

The first three are Dask configuration, handed to the processes as ``DASK_*`` environment variables
(``environment``: the Slurm launch's scheduler and workers) or set around a ``LocalCluster``'s start
(``configured``: its workers are handed the configuration by their nannies). A setting already in the
environment is kept (the user's own choice wins).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

HEARTBEAT_SECONDS = 5.0  # the shortest time between two heartbeats of a worker in memtrain's schedulers
SETTINGS: dict[str, Any] = {
    "distributed.admin.tick.interval": "500ms",
    "distributed.scheduler.work-stealing": False,
    "distributed.scheduler.active-memory-manager.start": False,
}


def variable(key: str) -> str:
    """The environment variable Dask reads ``key`` from: ``distributed.admin.tick.interval`` ->
    ``DASK_DISTRIBUTED__ADMIN__TICK__INTERVAL``."""
    return "DASK_" + "__".join(part.upper().replace("-", "_") for part in key.split("."))


def environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """``SETTINGS`` as the environment variables of a Dask process, but those ``environ`` sets already."""
    return {variable(key): str(value) for key, value in SETTINGS.items() if variable(key) not in environ}


@contextlib.contextmanager
def configured(environ: Mapping[str, str] = os.environ) -> Iterator[None]:
    """``SETTINGS`` in this process's Dask configuration while inside (those the environment does not set)."""
    import dask

    with dask.config.set({key: value for key, value in SETTINGS.items() if variable(key) not in environ}):
        yield


def dask_rule() -> Any:
    """Dask's own rule: the heartbeat interval in seconds the scheduler asks of its workers, by their count."""
    import distributed.scheduler

    rule = distributed.scheduler.heartbeat_interval
    return getattr(rule, "dask_rule", rule)


def slower(rule: Any) -> Any:
    def heartbeat_interval(workers: int) -> float:
        return max(HEARTBEAT_SECONDS, rule(workers))

    heartbeat_interval.dask_rule = rule  # type: ignore[attr-defined]
    return heartbeat_interval


@contextlib.contextmanager
def slower_heartbeats() -> Iterator[None]:
    """While inside, the schedulers of this process ask their workers for a heartbeat every ``HEARTBEAT_SECONDS``
    at least (Dask's rule when it asks for less often). The rule as it was again on exit."""
    import distributed.scheduler

    before = distributed.scheduler.heartbeat_interval
    distributed.scheduler.heartbeat_interval = slower(dask_rule())
    try:
        yield
    finally:
        distributed.scheduler.heartbeat_interval = before


def dask_setup(scheduler: Any) -> None:
    """Dask's preload hook (``dask scheduler --preload memtrain.cluster.dask_settings``): this scheduler process asks
    for heartbeats every ``HEARTBEAT_SECONDS`` at least, for as long as it runs."""
    import distributed.scheduler

    distributed.scheduler.heartbeat_interval = slower(dask_rule())
