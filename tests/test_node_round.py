"""The two-level round through ``memtrain train --cluster`` (issue 42; memtrain/cluster/nodes.py,
memtrain/train/loops/node_round.py): Dask workers on 127.0.0.1 standing for nodes, each with its own local
directory (its scratch) and ``MEMTRAIN_NODE_PROCESSES`` saying how many processes it stands for (for now,
threads of the worker's process: memtrain/train/loops/node_compute.py).

Bitwise the weights of a local run for 1, 2 and 3 nodes of unequal process counts; every update went through
node records and a step from the last partial; no gradient file on the shared filesystem; a node killed mid-round
(after its 2nd gradient, before its partial) ends the round, the tasks after the furthest whole partial run per
task, the same bits, and its restarted worker takes part from a later round.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("distributed")

from distributed import Client  # noqa: E402

from memtrain.cluster.broadcast import Broadcast  # noqa: E402
from memtrain.cluster.nodes import PROCESSES_ENV, node_processes  # noqa: E402
from memtrain.errors import InputError  # noqa: E402
from memtrain.train.loops.node_round import NodeParticipant  # noqa: E402
from memtrain.train.loops.sliced import SlicedParticipant  # noqa: E402
from tests.dask_processes import STOP_SECONDS, DaskProcesses, set_environ  # noqa: E402
from tests.node_models import slow_node_parts, wave_answer_raises  # noqa: E402
from tests.test_cluster import WIDE, WIDE_EPOCHS, digest, spy_records, train, write_job  # noqa: E402

pytestmark = pytest.mark.timeout(300)

TASKS = ("--set", "train.tasks_per_update=6")  # 6 tasks an update: 2+1+3 processes own 2, 1 and 3 of them
# Every node in every round: these tests assert who took part (a node's process count in each round's records, its
# log), which the straggler rule may change without changing a bit -- a node whose processes are still starting
# answers its first round late and is set aside for the rest of a short run. The rule has its own tests
# (test_cluster.py, test_backups.py); here it is off, as in the cluster cost bench.
EVERY_NODE = ("--set", "train.backup_ratio=0")


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny_data import blobs, write_dataset

    x, y = blobs(n=1500, features=8, classes=3)
    return write_dataset(tmp_path_factory.mktemp("data") / "blobs", x, y, shard_rows=300)


@pytest.fixture(scope="module")
def local_digest(tmp_path_factory: pytest.TempPathFactory, dataset: Path) -> str:
    folder = tmp_path_factory.mktemp("local")
    assert train(write_job(folder, dataset, WIDE_EPOCHS, WIDE), *TASKS) == 0
    return digest(folder / "run")


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskProcesses]:
    """One Dask scheduler for the module's tests, each of which starts and ends its own nodes (``dask``): a
    scheduler process fewer per test (~1 s of wall and CPU to start and stop one)."""
    processes = DaskProcesses(tmp_path_factory.mktemp("scheduler"))
    try:
        processes.start_scheduler()
        yield processes
    finally:
        processes.close()


@pytest.fixture
def dask(scheduler: DaskProcesses, tmp_path: Path) -> Iterator[tuple[DaskProcesses, Client]]:
    """The module's scheduler with this test's nodes (``start_nodes``), each in ``tmp_path / "dask"``; the nodes
    are ended after the test and awaited gone from the scheduler (the next test's nodes take the same names), and
    the scheduler's count of broadcast messages starts from nothing (``scheduler_calls``)."""
    processes = DaskProcesses(tmp_path / "dask", address=scheduler.address)
    with Client(processes.address, timeout=30) as client:
        # its BroadcastPlugin's count of messages (``scheduler_calls``), kept across runs (``idempotent``), emptied;
        # a lambda that names no global of this module, which the scheduler could not import
        client.run_on_scheduler(lambda dask_scheduler: [plugin.calls.clear() for name, plugin in
                                                        dask_scheduler.plugins.items() if name == "memtrain-broadcast"])
        try:
            yield processes, client
        finally:
            processes.close()
            deadline = time.monotonic() + STOP_SECONDS
            while client.scheduler_info()["workers"] and time.monotonic() < deadline:
                time.sleep(0.05)


def start_nodes(dask: DaskProcesses, client: Client, counts: list[int], env: dict[int, dict[str, str]] | None = None,
                *, nanny: bool = False) -> None:
    """Dask workers standing for nodes of ``counts`` processes; under a nanny only where a test needs one to restart
    a worker (a nanny is one more process importing distributed for each node: ~1 s of CPU)."""
    for j, count in enumerate(counts):
        dask.start_worker(f"node{j}", env={PROCESSES_ENV: str(count), **(env or {}).get(j, {})}, nanny=nanny)
    dask.wait_for_workers(client, {f"node{j}" for j in range(len(counts))})


def node_run(folder: Path, dataset: Path, address: str, monkeypatch, hidden: str = WIDE,
             extra: tuple[str, ...] = ()) -> tuple[list, list]:
    """The wide job (or the MLP of ``hidden``; ``extra`` options) on ``address``: the records posted (kind, body)
    and the step tasks (their ``chained``)."""
    records, steps = spy_records(monkeypatch), []
    run_steps = SlicedParticipant.run_step_tasks
    monkeypatch.setattr(SlicedParticipant, "run_step_tasks",
                        lambda participant, tasks, ranges: (steps.extend(tasks), run_steps(participant, tasks,
                                                                                             ranges))[1])
    assert train(write_job(folder, dataset, WIDE_EPOCHS, hidden), "--cluster", address, *TASKS, *EVERY_NODE,
                 *extra) == 0
    monkeypatch.undo()
    return records, steps


def kept_segments_taken(client: Client) -> int:
    """The segments of a last partial that the nodes' steps took from their own memory (``node_sum.KeptSum``), in
    every Dask worker's process together: where their step ran, whether the node's tasks ran on threads or in
    worker processes."""
    taken = client.run(lambda: importlib.import_module("memtrain.train.loops.node_sum").KeptSum.taken_in_process)
    return sum(taken.values())


def scheduler_calls(client: Client) -> dict[str, int]:
    """The messages the scheduler's BroadcastPlugin handled so far, by handler."""
    return client.run_on_scheduler(lambda dask_scheduler: dict(dask_scheduler.plugins["memtrain-broadcast"].calls))


def spy_partial_unlinks(monkeypatch) -> tuple[list[str], list[str]]:
    """The partials' and wave answers' files the server removed that were there: (after an update's step --
    ``discard_partials``, anywhere else in memtrain/cluster/broadcast.py -- a wave settled, a round's end), by
    name."""
    from memtrain.cluster import broadcast
    from memtrain.train.loops import node_round

    removed: tuple[list[str], list[str]] = ([], [])
    for module, names in ((node_round, removed[0]), (broadcast, removed[1])):
        def spied(paths, names=names, discard=module.discard) -> None:
            paths = list(paths)
            names += [p.name for p in paths if re.match(r"c-u|w-.*-r\d+\.json", p.name) and p.exists()]
            discard(paths)

        monkeypatch.setattr(module, "discard", spied)
    return removed


@pytest.mark.parametrize("counts", [[2], [1, 2], [2, 1, 3]], ids=["one", "1+2", "2+1+3"])
def test_nodes_of_unequal_process_counts_give_the_weights_of_a_local_run(counts: list[int], dask, dataset: Path,
                                                                         local_digest: str, tmp_path: Path,
                                                                         monkeypatch) -> None:
    processes, client = dask
    start_nodes(processes, client, counts)
    by_step, by_sweep = spy_partial_unlinks(monkeypatch)
    named: list[int] = []  # the updates whose partials' names the server made (nodes x segments names each)
    real = NodeParticipant.partials
    monkeypatch.setattr(NodeParticipant, "partials",
                        lambda participant, task, ends: (named.append(task.ticket), real(participant, task, ends))[1])
    spared: list[str] = []  # the server's renames of a task's gradient file into a spare
    rename = os.rename
    monkeypatch.setattr(os, "rename", lambda src, dst, *a, **k: (spared.append(Path(src).name)
                                                                 if Path(src).name.startswith("g-u") else None,
                                                                 rename(src, dst, *a, **k))[1])
    records, steps = node_run(tmp_path / "job", dataset, processes.address, monkeypatch)
    updates = len({t.update for t in steps})
    # the chained tasks' gradients stayed on their nodes: none to spare (before, one missing file tried per task)
    assert not spared, spared
    # made only to remove them: at the round's end, for the update stepped last (before, at every update: 0.8 ms
    # per update at 8 nodes of 1e7 parameters)
    assert len(named) <= 1, named
    # the server removed no partial after a step: each node removed its own when its next part started; the
    # round's end removed those of the update stepped last only (before, the server removed every update's)
    assert not by_step, by_step
    assert len({name.split("-t")[0] for name in by_sweep if name.startswith("c-u")}) <= 1, by_sweep
    # nor an answer to a wave every member answered: each member removed its own with its next answer; the round's
    # end removed those to its last wave only
    answers = [name for name in by_sweep if name.startswith("w-")]
    assert len({name.rsplit("-r", 1)[0] for name in answers}) <= 1 and len(answers) <= len(counts), answers
    assert [kind for kind, _ in records] == ["nodes", "node-step"] * updates
    # every node's process count, in the round's rank order (the slots' order, not the order they started in)
    assert all(sorted(body[1]) == sorted(counts) for kind, body in records if kind == "nodes")
    assert {t.chained for t in steps} == {6}  # every step read the last partial, no gradient file
    assert digest(tmp_path / "job" / "run") == local_digest
    # the node that ended each chain stepped its own slice from memory, not from the partial it had just written
    # (issue 42's bytes per node: node_sum.KeptSum): at least one segment per update
    assert kept_segments_taken(client) >= updates
    # the waves went through the exchange's files: the scheduler handled no message per member per wave
    calls = scheduler_calls(client)
    assert not {"memtrain_post", "memtrain_next", "memtrain_answer", "memtrain_await"} & set(calls), calls
    # each wave's end told by the member that completed it (one event), none asked for per wave
    assert calls["memtrain_begin"] >= 1 and calls.get("memtrain_done", 0) >= 2 * updates
    assert calls.get("memtrain_status", 0) < updates, calls
    run = tmp_path / "job" / "run"
    assert not [p.name for p in run.rglob("g-*")] and not [p.name for p in run.rglob("c-u*")]
    for j, count in enumerate(counts):  # each node's scratch is emptied after its fold
        assert not list((tmp_path / "dask" / f"node{j}" / "local").rglob("g-*"))
        # its tasks on one thread per process (the MLP is thread_safe; BLAS on one thread)
        log = (tmp_path / "dask" / f"node{j}" / "log.txt").read_text()
        assert f"memtrain node of {count} processes: its tasks on {count} thread(s)" in log, log[-2000:]


SMALL = "[4]"  # an MLP of 51 parameters: one checksum block, so a step of one slice whatever the members


@pytest.mark.timeout(240)  # bounded: before the fix a round stalled until the job's train.task_timeout (60 s)
def test_a_vector_of_fewer_blocks_than_nodes_still_goes_through_node_rounds(dask, dataset: Path, tmp_path: Path,
                                                                            monkeypatch) -> None:
    """A model of one checksum block on nodes of 1 and 2 processes, the straggler rule off: the step has one slice
    (``plan.member_slice``), so the node that ends the chain (rank 1) has none to keep for itself. It used to look
    its slice up anyway (``step_slices(...)[rank]``): an IndexError that ended its round loop without an answer,
    and the server then waited for that answer until ``train.task_timeout`` (60 s in this job; 600 s by default),
    killed the node as silent and ran every update per task. Now every update goes through a node record and a
    step from the last partial, with a local run's bits."""
    processes, client = dask
    assert train(write_job(tmp_path / "local", dataset, WIDE_EPOCHS, SMALL), *TASKS) == 0
    start_nodes(processes, client, [1, 2])
    records, steps = node_run(tmp_path / "job", dataset, processes.address, monkeypatch, SMALL)
    updates = len({t.update for t in steps})
    assert updates and [kind for kind, _ in records] == ["nodes", "node-step"] * updates
    assert {t.chained for t in steps} == {6}
    assert digest(tmp_path / "job" / "run") == digest(tmp_path / "local" / "run")


BROAD = "[50000]"  # an MLP of 600,003 parameters: over two segments of the chain, so the step is cut in two
SGD = ("--set", "train.optimizer=sgd")  # no optimizer state: the step on the chain's first and last nodes only


def test_a_step_dealt_to_the_first_and_last_node_gives_a_local_runs_bits(dask, dataset: Path, tmp_path: Path,
                                                                         monkeypatch) -> None:
    """SGD on nodes of 2+1+3 and a vector of more than two segments: the step goes to the first node of the chain
    (the first segment, read from the published partial) and the last (the rest, from its own memory, never
    published); the middle node steps nothing (``plan.node_step_deal``). A local run's bits. (The other tests'
    job uses Adam, whose step is spread over the nodes, the last slice to the last node.)"""
    processes, client = dask
    assert train(write_job(tmp_path / "local", dataset, WIDE_EPOCHS, BROAD), *TASKS, *SGD) == 0
    start_nodes(processes, client, [2, 1, 3])
    records, steps = node_run(tmp_path / "job", dataset, processes.address, monkeypatch, BROAD, SGD)
    updates = len({t.update for t in steps})
    assert updates and [kind for kind, _ in records] == ["nodes", "node-step"] * updates
    deals = {body[1] for kind, body in records if kind == "node-step"}
    assert deals == {((0, 262144), (0, 0), (262144, 600003))}, deals
    assert {(t.lo, t.hi) for t in steps} == {(0, 262144), (262144, 600003)}
    assert kept_segments_taken(client) >= 2 * updates  # the last node's two segments, each update
    assert digest(tmp_path / "job" / "run") == digest(tmp_path / "local" / "run")


def test_a_part_that_raises_is_answered_as_the_waves_error(tmp_path: Path) -> None:
    """``broadcast.member_part``: a member whose part of a wave raises answers the error (the wave ends "failed",
    the server completes the update per task) and reads the next wave; before, the exception ended its loop with
    no answer, and with no straggler rule the server waited for it until ``train.task_timeout``."""
    from types import SimpleNamespace

    from memtrain.cluster.broadcast import WaveFiles, follow_files

    def update(number: int) -> None:
        raise RuntimeError(f"no update {number} in this plan")

    actor = SimpleNamespace(state=SimpleNamespace(plan=SimpleNamespace(update=update)))
    files = WaveFiles(tmp_path, "0123456789ab")
    files.post(0, "grads", (3, 3, 0, 6, 60, ()))
    files.end()  # the round ends after this wave: the loop returns once it answered
    assert follow_files(actor, files, 0, 1, ended=lambda: False, done=lambda wave: None) == 1
    answer = json.loads(files.answer_path(0, 0).read_text())
    assert answer["numbers"] == [] and answer["blob"] == ""
    assert answer["error"].startswith("member 0's part of a 'grads' wave raised RuntimeError: no update 3 in this "
                                      "plan"), answer


def test_a_node_killed_mid_round_has_its_range_run_again_and_the_bits_stay(dask, dataset: Path, local_digest: str,
                                                                          tmp_path: Path, monkeypatch) -> None:
    """The node of 2 processes among 1+2+1 (rank 1; its range: 3 of the 6 tasks) SIGKILLs itself after writing its
    2nd gradient into its scratch, before its partial: the round ends, the node after it stops waiting, the tasks
    after the furthest whole partial (rank 0's, of 1 task) run per task, and the step adds them onto that partial:
    the same bits; the next update opens a round of the nodes left (and of the killed node's restarted worker).

    The round's end reaches the scheduler after its loops have returned (``end_after_the_loops``), so the round's
    leftovers are deleted at once: the partial the step reads must not be among them. Before, it was, and on a
    loaded machine every step slice then waited for it until killed as silent, every worker in turn ("no Dask
    worker left for 120 s"), whenever the killed node was not rank 0 (ranks follow the workers' addresses)."""
    processes, client = dask
    fired = tmp_path / "fired"
    start_nodes(processes, client, [1, 1, 1], nanny=True)
    # the node of 2 that will be killed is rank 1 (the round's ranks: the workers' addresses in order); its process
    # count and fault hook are read when first needed; its nanny restarts it from the nanny's environment: a node of 1
    ranks = sorted(client.scheduler_info()["workers"])
    client.run(set_environ, {PROCESSES_ENV: "2", "MEMTRAIN_FAULT": "after_grad_write:2",
                             "MEMTRAIN_FAULT_ONCE": str(fired)}, workers=[ranks[1]])
    # rank 0's partial (1 task) is written before rank 1 dies: its part starts 2 s late (on a loaded machine rank 1
    # could write its 2 gradients first, and then no partial is whole: every task per task, nothing to resume from)
    client.run(slow_node_parts, 2.0, workers=[ranks[1]])
    opened: list[int] = []
    open_round = Broadcast.open
    monkeypatch.setattr(Broadcast, "open", lambda round: (open_round(round), opened.append(round.size))[0])
    end_after_the_loops(monkeypatch)
    records, steps = node_run(tmp_path / "job", dataset, processes.address, monkeypatch)
    assert fired.exists()
    events = (tmp_path / "job" / "run" / "events.log").read_text()
    assert re.search(r"broadcast round of 3 workers ended: a worker of the round left the scheduler; 5 of 6 "
                     r"gradient tasks \(after the partial of the first 1\) run per task", events), events
    resumed = [t.chained for t in steps if t.chained != 6]
    assert resumed and set(resumed) == {1}  # that update's step: from rank 0's partial
    assert opened[0] == 3 and len(opened) >= 2
    assert digest(tmp_path / "job" / "run") == local_digest
    assert not [p.name for p in (tmp_path / "job" / "run").rglob("c-u*")]


def test_the_node_ending_the_chain_lost_in_its_step_has_its_range_computed_again(dask, dataset: Path,
                                                                                 local_digest: str, tmp_path: Path,
                                                                                 monkeypatch) -> None:
    """Nodes of 1+1+1: the last of the chain (rank 2, tasks 4-5) keeps its step slice of the last partial in its
    memory, unpublished (``plan.node_step_deal``), and SIGKILLs itself in that step (``mid_step``, once): its
    answer to the gradients is in, but the slice it kept is gone with it (the wide model is under two segments:
    it steps the whole vector, the step's one slice). The step wave ends (the node left), the last partial is not
    whole, so the server reads the furthest whole one (the first 4 tasks'), computes tasks 4 and 5 again per task
    and steps the slice per task from those: the same bits as a local run."""
    processes, client = dask
    fired = tmp_path / "fired"
    start_nodes(processes, client, [1, 1, 1])
    ranks = sorted(client.scheduler_info()["workers"])  # the round's ranks: the workers' addresses in order
    client.run(set_environ, {"MEMTRAIN_FAULT": "mid_step:1", "MEMTRAIN_FAULT_ONCE": str(fired)}, workers=[ranks[2]])
    records, steps = node_run(tmp_path / "job", dataset, processes.address, monkeypatch)
    assert fired.exists()
    events = (tmp_path / "job" / "run" / "events.log").read_text()
    assert re.search(r"broadcast round of 3 workers ended: a worker of the round left the scheduler; the step's 1 "
                     r"slices run per task", events), events
    assert re.search(r"update \d+: the partial of its first 6 tasks is not whole .*; tasks 4-5 computed again per "
                     r"task", events), events
    assert digest(tmp_path / "job" / "run") == local_digest
    assert not [p.name for p in (tmp_path / "job" / "run").rglob("c-u*")]
    assert not [p.name for p in (tmp_path / "job" / "run").rglob("g-*")]


def end_after_the_loops(monkeypatch, seconds: float = 10.0) -> None:
    """The scheduler answers a round's end (``memtrain_end``) only once the round's loops have returned (they see
    its end file first), as on a loaded machine, where the round's leftovers are then deleted at once: the order
    that made the killed node's test fail in full suite runs (the partial the step reads was among them)."""
    call = Broadcast.call

    def end_late(round: Broadcast, handler: str, *args, **kwargs):
        if handler == "memtrain_end":
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and any(
                    not loop.done() for token, loop in round.loops.items()
                    if token in {slot.token for slot in round.pool.slots}):
                time.sleep(0.01)
        return call(round, handler, *args, **kwargs)

    monkeypatch.setattr(Broadcast, "call", end_late)


def test_a_node_that_joins_mid_run_takes_part_from_the_next_update(dask, dataset: Path, local_digest: str,
                                                                   tmp_path: Path, monkeypatch) -> None:
    """A node of 3 joins while the first round (nodes of 1 and 2) runs: the round ends after that update, the next
    round's node records carry three counts, and the weights are a local run's."""
    processes, client = dask
    start_nodes(processes, client, [1, 2])
    opened: list[int] = []
    open_round = Broadcast.open

    def open_then_join(round: Broadcast) -> bool:
        started = open_round(round)
        opened.append(round.size)
        if len(opened) == 1:  # joins while this round runs
            processes.start_worker("node2", env={PROCESSES_ENV: "3"})
            processes.wait_for_workers(client, {"node0", "node1", "node2"})
        return started

    monkeypatch.setattr(Broadcast, "open", open_then_join)
    records, steps = node_run(tmp_path / "job", dataset, processes.address, monkeypatch)
    counts = [sorted(body[1]) for kind, body in records if kind == "nodes"]
    assert opened[:2] == [2, 3] and counts[0] == [1, 2] and counts[1:] == [[1, 2, 3]] * (len(counts) - 1)
    assert {t.chained for t in steps} == {6}
    assert digest(tmp_path / "job" / "run") == local_digest


def test_the_server_is_told_when_a_wave_ends_and_asks_nothing_per_second(dask, dataset: Path, local_digest: str,
                                                                         tmp_path: Path, monkeypatch) -> None:
    """Nodes of 1 and 2 whose gradient waves take over a second each (``slow_node_parts``), with the server's
    fallback looks at the answer files and asks of the scheduler pushed out of reach: every wave ends because the
    member that completed it told the server (one event), and the scheduler handled no message per second of a
    wave -- before, the server asked it how the round stood every 0.25 s of a wave (4 or more per update here)."""
    from memtrain.cluster import broadcast

    processes, client = dask
    start_nodes(processes, client, [1, 2])
    client.run(slow_node_parts, 1.0)
    for name in ("LOOK_SECONDS", "STATUS_SECONDS"):  # no fallback within the run: only being told ends a wave
        monkeypatch.setattr(broadcast, name, 1e6, raising=False)
    started = time.monotonic()
    records, steps = node_run(tmp_path / "job", dataset, processes.address, monkeypatch)
    updates = len({t.update for t in steps})
    assert updates == 7 and {t.chained for t in steps} == {6}
    assert time.monotonic() - started < 120
    assert digest(tmp_path / "job" / "run") == local_digest
    calls = scheduler_calls(client)
    assert calls.get("memtrain_status", 0) < updates, calls
    assert 2 * updates <= calls["memtrain_done"] <= 2 * 2 * updates, calls  # at most one per member per wave


def test_a_member_whose_loop_ends_without_answering_fails_the_wave_at_once(dask, dataset: Path, local_digest: str,
                                                                          tmp_path: Path, monkeypatch) -> None:
    """A member's loop of the round raises (its worker lives on: no member left the scheduler) writing its 2nd
    answer: the server sees the loop ended at its next look and fails the wave with that error, rather than
    waiting for an answer that cannot come (before: until train.task_timeout, here out of reach); the update's tasks
    run per task, the same bits, and the next round takes the member back."""
    processes, client = dask
    start_nodes(processes, client, [1, 2])
    client.run(wave_answer_raises, 2, workers=[sorted(client.scheduler_info()["workers"])[1]])
    started = time.monotonic()
    records, steps = node_run(tmp_path / "job", dataset, processes.address, monkeypatch)
    assert time.monotonic() - started < 50  # train.task_timeout is 60 s
    events = (tmp_path / "job" / "run" / "events.log").read_text()
    assert re.search(r"broadcast round of 2 workers ended: a task failed: worker \d+ \(Dask worker tcp://[\d.:]+\): "
                     r"its loop of the round ended \(RuntimeError: answer 2 raised \(a test\)\)", events), events
    assert len({t.update for t in steps}) == 7 and sum(t.chained == 6 for t in steps) >= 5
    assert digest(tmp_path / "job" / "run") == local_digest


def test_a_lost_server_is_pushed_to_the_members_workers_not_asked_for(tmp_path: Path) -> None:
    """The scheduler's plugin, when a round's client (its server) leaves, pushes the round's end to each member's
    worker (``ENDED_OP``), whose handler ``RoundEnds`` installed: a member waiting for a record stops without
    asking every 2 s. A worker without the handler is sent nothing (an unknown message closes its stream)."""
    import asyncio

    from memtrain.cluster.broadcast import ENDED, ENDED_OP, BroadcastPlugin, RoundEnds, WaveFiles, follow_files

    class Scheduler:
        def __init__(self, plugins: dict) -> None:
            self.handlers, self.workers, self.worker_plugins, self.sent = {}, {"w1": 0, "w2": 0}, plugins, []

        def send_all(self, clients: dict, workers: dict) -> None:
            self.sent.append(workers)

        def log_event(self, topic: str, msg: dict) -> None:
            pass

    class Worker:
        stream_handlers: dict = {}

    for plugins, pushed in (({RoundEnds.name: RoundEnds()}, True), ({}, False)):
        scheduler, plugin = Scheduler(plugins), BroadcastPlugin()
        asyncio.run(plugin.start(scheduler))
        plugin.begin("r1", members=["w1", "w2"], client="c1")
        plugin.begin("r2", members=["w2"], client="c2")
        plugin.remove_client(scheduler, "c1")
        assert plugin.rounds["r1"].ended and not plugin.rounds["r2"].ended
        expected = [{"w1": [{"op": ENDED_OP, "ident": "r1"}], "w2": [{"op": ENDED_OP, "ident": "r1"}]}]
        assert scheduler.sent == (expected if pushed else [])
    worker = Worker()
    RoundEnds().setup(worker)
    worker.stream_handlers[ENDED_OP](ident="r1")
    assert "r1" in ENDED
    # a member of r1 waiting for its first record stops at its next look, without asking the scheduler
    asked: list[int] = []
    started = time.monotonic()
    assert follow_files(None, WaveFiles(tmp_path, "r1"), 0, 2, lambda: asked.append(1) or False,
                        lambda wave: None) == 0
    assert not asked and time.monotonic() - started < 1.0


def test_the_process_count_is_checked() -> None:
    assert node_processes({}) == 0 and node_processes({PROCESSES_ENV: "3"}) == 3
    for bad in ("0", "two", "-1"):
        with pytest.raises(InputError, match=PROCESSES_ENV):
            node_processes({PROCESSES_ENV: bad})


def test_a_member_waiting_for_a_partial_that_will_not_come_gives_up_when_the_round_ended(tmp_path: Path) -> None:
    """``fold_node(..., abandoned=)``: the wait for the partial before the range ends as soon as ``abandoned()``
    says so (the round ended), long before the deadline; nothing is published."""

    import numpy as np

    from memtrain.cluster.nodes import every
    from memtrain.train.loops.node_sum import Abandoned, PartialSum, fold_node

    chain = PartialSum(tmp_path, update=3, attempt=0, version=2, size=1000)
    ended = every(0.2, lambda: True)  # asked at most every 0.2 s, never in the first 0.2 s
    started = time.monotonic()
    with pytest.raises(Abandoned):
        fold_node(chain, 2, 4, lambda t: np.ones(1000, np.float32), deadline=started + 60, abandoned=ended)
    assert 0.2 <= time.monotonic() - started < 5
    assert not list(tmp_path.iterdir())


def test_the_straggler_rule_takes_a_node_as_one_unit() -> None:
    """Nodes of 1, 2 and 1 processes given 1, 4 and 2 of 7 tasks (``node_tasks``) each need 1, 2 and 2 tasks'
    time: with node 0 in after 1 s and the rule at 2x, node 2 is late after 2 x 2 x 1 s, not 2 x 1 s."""
    from memtrain.cluster.broadcast import RoundState, Wave, due_at
    from memtrain.train.loops.node_round import node_shares
    from memtrain.train.plan import node_tasks

    shares = node_shares(node_tasks(7, [1, 2, 1]), [1, 2, 1])
    assert shares == [1, 2, 2]
    state = RoundState(members=["a", "b", "c"], client="")
    state.waves[0] = Wave(record=b"", posted=100.0, parts=3, shares=shares)
    state.waves[0].answers[0] = (101.0, [], b"", "")
    assert due_at(state, 0, 2.0, 0.0, 0.0) == pytest.approx(104.0)
    state.waves[0].answers[1] = (102.0, [], b"", "")  # node 1: 2 tasks' time in 2 s, 1 s per task as node 0
    assert due_at(state, 0, 2.0, 0.0, 0.0) == pytest.approx(104.0)


def test_the_server_reads_one_file_of_answers_per_wave_whatever_the_members(tmp_path: Path, monkeypatch) -> None:
    """The member that completes a wave writes every answer to it into one file (``WaveFiles.merge``), and the
    server reads that file alone: its reads per wave do not grow with the nodes (issue 42's server CPU; before,
    one file per member). A second member that saw the wave complete leaves the first's file as it is; that
    member removes it with its next answer, and a wave that settled otherwise has it removed by the server."""
    from memtrain.cluster import broadcast
    from memtrain.cluster.broadcast import RoundState, Wave, WaveFiles

    members = 8
    files = WaveFiles(tmp_path, "0123456789ab")
    for rank in range(members):
        files.answer(4, rank, [float(rank), 0.5], bytes([rank]), "", 0.25 * rank)
    assert files.complete(4, members) and files.merge(4, members)
    first = files.answers_path(4).stat()
    assert not files.merge(4, members)  # published already: the second writer's is dropped, the file untouched
    assert files.answers_path(4).stat().st_ino == first.st_ino
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left
    reads: list[str] = []
    real = broadcast.read_wave_file
    monkeypatch.setattr(broadcast, "read_wave_file", lambda path: (reads.append(path.name), real(path))[1])
    state = RoundState(members=[str(r) for r in range(members)], client="")
    state.waves[4] = Wave(record=b"", posted=0.0, parts=members)
    assert files.collect(state, 4) == members
    assert reads == [files.answers_path(4).name]
    assert state.waves[4].answers == {r: (0.25 * r, [float(r), 0.5], bytes([r]), "") for r in range(members)}
    # without the merged file (a wave not every member answered), one file per member, as before
    files.answer(5, 0, [], b"", "", 0.1)
    state.waves[5] = Wave(record=b"", posted=0.0, parts=members)
    assert not files.merge(5, members) and not files.answers_path(5).exists()
    reads.clear()
    assert files.collect(state, 5) == 1 and len(reads) == 1 + members
    files.settle(4, members)  # settled other than done: the server removes the merged file too
    assert not files.answers_path(4).exists()


def test_a_member_removes_the_file_of_answers_it_wrote_with_its_next_answer(tmp_path: Path) -> None:
    """``follow_files``: the member that completed wave 0 wrote its one file of answers and, once it answered wave
    1, removed it with its own answer to wave 0 -- the server posted wave 1 only after reading it."""
    from types import SimpleNamespace

    from memtrain.cluster.broadcast import WaveFiles, follow_files

    files = WaveFiles(tmp_path, "0123456789ab")
    told: list[int] = []
    actor = SimpleNamespace(state=SimpleNamespace(plan=SimpleNamespace(update=lambda number: 1 / 0)))
    files.post(0, "grads", (3, 3, 0, 6, 60, ()))
    files.answer(0, 0, [], b"", "", 0.1)  # member 0 answered already: member 1 completes wave 0
    posted = []

    def done(wave: int) -> None:
        told.append(wave)
        if wave == 0:
            assert files.answers_path(0).exists()  # written before the server is told
            posted.append(json.loads(files.answers_path(0).read_text()))
            files.post(1, "grads", (3, 3, 0, 6, 60, ()))
            files.end()

    assert follow_files(actor, files, 1, 2, ended=lambda: False, done=done) == 2
    assert [a["error"][:40] for a in posted[0]["answers"]] == ["", "member 1's part of a 'grads' wave raised"]
    assert told == [0, 1]  # wave 1: member 1's error, told at once
    assert not files.answers_path(0).exists() and not files.answer_path(0, 1).exists()
    assert not files.answers_path(1).exists()  # wave 1 was not complete: no file of answers


def test_a_wave_record_reads_back_as_it_was_posted(tmp_path: Path) -> None:
    """A round of nodes' records are JSON files (never pickles): a step's template and a node record come back
    equal, and an answer's numbers and digests too."""
    from memtrain.cluster.broadcast import RoundState, Wave, WaveFiles
    from memtrain.train.messages import StepTask

    files = WaveFiles(tmp_path, "0123456789ab")
    step = StepTask(task=0, attempt=0, update=3, version=3, lo=0, hi=0, rows=60, lr=0.1 / 3, tasks=6,
                    retried=((2, 1),), chained=4)
    node = ((3, 3, 1, 6, 60, ("", "s", "", "", "", "")), (1, 2), 600.0, 3)
    files.post(0, "nodes", node)
    files.post(1, "step", step)
    assert not files.record(0).exists()  # the previous wave's record goes once the next is posted
    assert files.next(1, stop=lambda: True) == ("step", step)
    files.post(2, "nodes", node)
    assert files.next(2, stop=lambda: True) == ("nodes", node)
    deal = ((0, 262144), (0, 0), (262144, 1000000))  # a round of nodes' step: the template and each rank's slice
    files.post(2, "node-step", (step, deal))
    assert files.next(2, stop=lambda: True) == ("node-step", (step, deal))
    assert files.next(3, stop=lambda: True) is None  # not posted: stop() ends the wait
    files.answer(2, 1, [4.0, 0.25, 0.5], b"\x01\x02", "", 1.5)
    state = RoundState(members=["a", "b"], client="")
    state.waves[2] = Wave(record=b"", posted=0.0, parts=2)
    assert not files.complete(2, 2)  # rank 0's answer is not in yet: rank 1 does not tell the server
    assert files.collect(state, 2) == 1
    # its time is the member's own, from the record to the answer (the server looks only when told, or later)
    assert state.waves[2].answers[1] == (1.5, [4.0, 0.25, 0.5], b"\x01\x02", "")
    files.answer(2, 0, [], b"", "", 0.5)
    assert files.complete(2, 2) and files.collect(state, 2) == 1
    assert files.answer_path(2, 1).exists()  # the answers stay until the wave settled: the last member saw them
    files.settle(2, 2)
    assert not files.answer_path(2, 0).exists() and not files.answer_path(2, 1).exists()
    files.end()
    assert files.ended()


def test_the_benchmark_counts_a_nodes_shared_bytes_from_its_trace(tmp_path: Path) -> None:
    """benchmarks/node_round.py ``--bytes``: calls on run-directory files by their return values, a mapped version
    once per file (two threads' maps of it: one node fetch), the node's scratch and the dataset left out."""
    from benchmarks.node_round import node_bytes

    run, data = tmp_path / "run-1-2", tmp_path / "data-1"
    scratch = run / "dask-scratch-space" / "worker-1" / "memtrain-node"
    trace = tmp_path / "strace.txt"
    trace.write_text("\n".join([
        f"101 mmap(NULL, 4000128, PROT_READ, MAP_SHARED, 12<{run}/weights/v3.npy>, 0) = 0x7f00",
        f"102 mmap(NULL, 4000128, PROT_READ, MAP_SHARED, 14<{run}/weights/v3.npy>, 0) = 0x7f10",
        f"101 read(15<{run}/x/c-u3-a0-t2-s0.npy>, \"...\", 1048700) = 1048700",
        f"101 pwrite64(16<{run}/x/v4.tmp>, \"...\", 2000000, 128) = 2000000",
        f"101 read(17<{scratch}/g-u3-t2-a0.npy>, \"...\", 4000000) = 4000000",
        f"101 read(18<{data}/train/x-00000.npy>, \"...\", 128) = 128",
        f"101 mmap(NULL, 7328, PROT_READ, MAP_SHARED, 19<{data}/train/x-00000.npy>, 0) = 0x7f20",
        "101 read(3<socket:[1234]>, \"...\", 65536) = 600",
    ]))
    found = node_bytes(trace, tmp_path)
    assert (found["mapped"], found["read"], found["written"], found["rows"]) == (4000128, 1048700, 2000000, 128)
