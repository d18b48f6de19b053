"""The two-level round's reduction (memtrain/train/loops/node_sum.py): nodes owning contiguous task ranges continue one
fold through partial-sum files, and the last partial is reduce.py's in-order fold bit for bit, for any task count,
vector size (a multiple of the checksum block or not), node count and split of processes; the partial files are
whole, checked per block, named by what they hold, never replaced, and one of another update or attempt is never used.
The alternatives measured by benchmarks/node_reduction.py (a fixed tree, a binned exact sum) are shown NOT to give
today's bits, which is why the chain was chosen (docs/cluster.md, "The two-level round")."""

from __future__ import annotations

import functools
import os
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.node_reduction import binned_sum, tree_sum
from memtrain.errors import CorruptFileError, MemtrainError
from memtrain.files import DIGEST_BYTES
from memtrain.train.exchange.weights import BLOCK, block_count
from memtrain.train.loops.node_sum import (
    KeptSum,
    PartialSum,
    StalePartial,
    fold_node,
    node_tasks,
    read_sum,
    resume_point,
    segment_ranges,
)
from memtrain.train.loops.reduce import reduce_and_step
from memtrain.train.optim import OptimizerConfig, state_names
from memtrain.train.plan import SEGMENT_BLOCKS, node_step_deal


def gradients(seed: int, tasks: int, size: int) -> list[np.ndarray]:
    """Float32 gradients of widely spread magnitudes, so that any change in the order of additions shows."""
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=size) * 10.0 ** rng.integers(-4, 5, size=size)).astype(np.float32) for _ in range(tasks)]


def in_order(grads: list[np.ndarray]) -> np.ndarray:
    """The sequential fold in task order, as reduce.py adds."""
    return functools.reduce(lambda a, b: np.add(a, b, dtype=np.float32), grads[1:], grads[0].copy())


def run_chain(folder: Path, grads: list[np.ndarray], processes: list[int], *, segment_blocks: int = 1,
              update: int = 7, attempt: int = 0) -> np.ndarray:
    """Every node's processes as threads, all started at once (a node waits for its predecessor's segments)."""
    chain = PartialSum(folder, update=update, attempt=attempt, version=6, size=grads[0].size,
                       segment_blocks=segment_blocks)
    deadline = time.monotonic() + 60
    errors: list[BaseException] = []

    def work(lo: int, hi: int, share: tuple[int, int]) -> None:
        try:
            fold_node(chain, lo, hi, grads.__getitem__, deadline=deadline, share=share)
        except BaseException as exc:  # noqa: BLE001 -- re-raised in the test's thread below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(lo, hi, (i, count)))
               for (lo, hi), count in zip(node_tasks(len(grads), processes), processes, strict=True)
               for i in range(count)]
    for thread in threads[::-1]:  # the last node first: it must wait for the others
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return read_sum(chain, len(grads), deadline=deadline)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), tasks=st.integers(1, 9),
       size=st.one_of(st.integers(1, 50), st.integers(BLOCK - 3, 3 * BLOCK + 5)),
       processes=st.lists(st.integers(1, 4), min_size=1, max_size=5), segment_blocks=st.integers(1, 2))
def test_the_last_partial_is_the_in_order_fold_for_any_layout(tmp_path: Path, seed: int, tasks: int, size: int,
                                                               processes: list[int], segment_blocks: int) -> None:
    folder = tmp_path / f"x{seed}-{tasks}-{size}-{len(processes)}"
    folder.mkdir()
    grads = gradients(seed, tasks, size)
    assert run_chain(folder, grads, processes, segment_blocks=segment_blocks).tobytes() == in_order(grads).tobytes()
    shutil.rmtree(folder)


def test_a_slice_owner_reads_its_slice_of_the_last_partial(tmp_path: Path) -> None:
    size = 5 * BLOCK + 9
    grads = gradients(5, 4, size)
    whole = run_chain(tmp_path, grads, [1, 3], segment_blocks=2)
    chain = PartialSum(tmp_path, update=7, attempt=0, version=6, size=size, segment_blocks=2)
    for lo, hi in [(0, size), (BLOCK, 3 * BLOCK), (3 * BLOCK, 5 * BLOCK), (5 * BLOCK, size), (7, 7)]:
        got = read_sum(chain, 4, deadline=time.monotonic() + 5, lo=lo, hi=hi)
        assert got.tobytes() == whole[lo:hi].tobytes(), (lo, hi)
    with pytest.raises(ValueError, match="not a slice"):
        read_sum(chain, 4, deadline=time.monotonic() + 5, lo=0, hi=size + 1)


def test_after_a_node_is_lost_a_new_attempt_continues_from_the_furthest_whole_partial(tmp_path: Path) -> None:
    """Nodes of 2, 1 and 3 processes; the last one lost after publishing one of its 3 segments. Attempt 1 continues
    from attempt 0's furthest whole partial on the two nodes left (new ranges) and gives the in-order fold's bits;
    a damaged partial is passed over for an earlier one."""
    size, tasks = 3 * BLOCK - 5, 7
    grads = gradients(9, tasks, size)
    lost = PartialSum(tmp_path, update=7, attempt=0, version=6, size=size, segment_blocks=1)
    ranges = node_tasks(tasks, [2, 1, 3])
    assert ranges == [(0, 2), (2, 3), (3, 7)]
    deadline = time.monotonic() + 30
    for lo, hi in ranges[:2]:
        fold_node(lost, lo, hi, grads.__getitem__, deadline=deadline)
    fold_node(lost, 3, 7, grads.__getitem__, deadline=deadline, share=(0, 3))  # 1 of its 3 processes finished
    boundaries = [hi for _, hi in ranges]
    assert resume_point(lost, boundaries) == 3
    again = PartialSum(tmp_path, update=7, attempt=1, version=6, size=size, segment_blocks=1)
    for a, b in node_tasks(tasks - 3, [2, 1]):
        fold_node(again, 3 + a, 3 + b, grads.__getitem__, deadline=deadline, source=lost if a == 0 else None)
    assert read_sum(again, tasks, deadline=deadline).tobytes() == in_order(grads).tobytes()

    damaged = lost.path(3, 2)
    damaged.write_bytes(damaged.read_bytes()[:-1])
    assert resume_point(lost, boundaries) == 2
    os.unlink(lost.path(2, 0))
    assert resume_point(lost, boundaries) == 0
    with pytest.raises(ValueError, match="its own update and version"):
        fold_node(again, 3, 4, grads.__getitem__, deadline=deadline,
                  source=PartialSum(tmp_path, update=8, attempt=0, version=6, size=size, segment_blocks=1))


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_the_step_from_the_last_partial_gives_the_local_runs_weights(tmp_path: Path, name: str) -> None:
    """reduce_and_step from every gradient (a local run) and from the chain's last partial: the same bits."""
    size, tasks = 2 * BLOCK + 77, 7
    grads = gradients(3, tasks, size)
    rng = np.random.default_rng(4)
    weights = rng.normal(size=size).astype(np.float32)
    optimizer = OptimizerConfig(name=name, lr=0.01)
    state = {k: np.abs(rng.normal(size=size)).astype(np.float32) for k in state_names(optimizer)}

    def step(given: list[np.ndarray]) -> bytes:
        out = np.empty(size, dtype=np.float32)
        state_out = {k: np.empty(size, dtype=np.float32) for k in state}
        digests = np.zeros((block_count(size), DIGEST_BYTES), dtype=np.uint8)
        assert reduce_and_step(grads=given, rows=1000, weights=weights, state_in=state, weights_out=out,
                               state_out=state_out, lo=0, hi=size, optimizer=optimizer, step=3, lr=0.01,
                               digests=digests)
        return out.tobytes() + b"".join(v.tobytes() for v in state_out.values()) + digests.tobytes()

    local = step(grads)
    for processes in ([3], [1, 2], [2, 1, 3], [1] * 7, [4] * 9):
        folder = tmp_path / "-".join(map(str, processes))
        folder.mkdir()
        assert step([run_chain(folder, grads, processes)]) == local, processes


def test_the_tree_and_binned_alternatives_do_not_keep_todays_bits() -> None:
    """Why the chain: a sum tree fixed by the plan, or an order-independent binned sum, are reproducible for any
    node layout too, but they are not reduce.py's fold, so every recorded golden would change."""
    grads = gradients(11, 8, 4096)
    fold = in_order(grads)
    tree, binned = tree_sum(grads), binned_sum(grads)
    assert tree.tobytes() != fold.tobytes()
    assert binned.tobytes() != fold.tobytes()
    assert binned.tobytes() == binned_sum(grads[::-1]).tobytes()  # order-independent, as it promises
    exact = np.sum([g.astype(np.float64) for g in grads], axis=0)
    np.testing.assert_allclose(binned, exact, rtol=2e-7, atol=1e-30)


def test_node_ranges_are_contiguous_in_node_order_and_cover_every_task() -> None:
    for tasks in range(0, 20):
        for processes in ([1], [1, 1], [3, 1, 2], [4, 4, 4, 4], [1] * 7):
            ranges = node_tasks(tasks, processes)
            assert ranges[0][0] == 0 and ranges[-1][1] == tasks
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:], strict=False))
    assert node_tasks(12, [1, 2, 3]) == [(0, 2), (2, 6), (6, 12)]
    with pytest.raises(ValueError, match="at least one process"):
        node_tasks(4, [1, 0])


def test_segments_are_whole_checksum_blocks() -> None:
    assert segment_ranges(2 * BLOCK + 1, 1) == [(0, BLOCK), (BLOCK, 2 * BLOCK), (2 * BLOCK, 2 * BLOCK + 1)]
    assert segment_ranges(5, 16) == [(0, 5)]


def test_the_node_ending_the_chain_steps_its_own_slice_from_memory_unpublished(tmp_path: Path) -> None:
    """Issue 42's bytes per node: the last node of the chain keeps the segments of its own step slice of the last
    partial (``KeptSum``, the slice ``node_step_deal`` gives it: at least half the vector, whole segments) instead
    of publishing them, and its step reads them from there -- the same bits. The other segments are published for
    the first node's slice; the kept ones are taken once (a step of them run elsewhere finds no file: the server
    computes the last node's range again, node_round.py); another chain's segments are not kept."""
    size, counts = 5 * BLOCK + 9, [1, 2]
    grads = gradients(11, 5, size)
    chain = PartialSum(tmp_path, update=7, attempt=0, version=6, size=size, segment_blocks=1)
    ranges = node_tasks(len(grads), counts)
    (lo0, hi0), (lo1, hi1) = ranges
    other, own = node_step_deal(size, ranges, BLOCK, segment_blocks=1)
    assert other == (0, 2 * BLOCK) and own == (2 * BLOCK, size)  # the last node steps at least half
    kept = KeptSum()
    with pytest.raises(ValueError, match="whole segments"):
        kept.expect(chain, BLOCK + 1, size)
    kept.expect(chain, *own)
    deadline = time.monotonic() + 30
    fold_node(chain, lo0, hi0, grads.__getitem__, deadline=deadline)
    fold_node(chain, lo1, hi1, grads.__getitem__, deadline=deadline, keep=kept)
    mine = [s for s, (a, b) in enumerate(chain.segments()) if a < own[1] and b > own[0]]
    assert sorted(s for _, s in kept.segments) == mine == [2, 3, 4, 5]
    assert [s for s in range(len(chain.segments())) if chain.path(hi1, s).exists()] == [0, 1]  # kept: unpublished
    whole = in_order(grads)
    got = read_sum(chain, hi1, deadline=deadline, lo=own[0], hi=own[1], kept=kept)
    assert got.tobytes() == whole[own[0]:own[1]].tobytes()
    assert kept.taken == len(mine) and not kept.segments  # taken once: a second step of the slice finds no file
    with pytest.raises(MemtrainError, match="not published in time"):
        read_sum(chain, hi1, deadline=time.monotonic() + 0.2, lo=own[0], hi=own[1], kept=kept)
    got = read_sum(chain, hi1, deadline=deadline, lo=other[0], hi=other[1], kept=kept)  # the first node's slice
    assert got.tobytes() == whole[other[0]:other[1]].tobytes()
    assert resume_point(chain, [hi0, hi1]) == hi0  # the last partial is not whole: a lost last node's range redone
    kept.expect(PartialSum(tmp_path, update=8, attempt=0, version=7, size=size, segment_blocks=1), *own)
    fold_node(chain, lo1, hi1, grads.__getitem__, deadline=deadline, keep=kept)  # another chain's: published
    assert not kept.segments and all(chain.path(hi1, s).exists() for s in range(len(chain.segments())))


def test_the_step_deal_of_a_round_of_nodes() -> None:
    """``node_step_deal``: the first and the last node of the chain step, the last at least half the vector, in
    whole segments; the nodes between, and nodes without tasks, none; one node in the chain steps it all."""
    segment = SEGMENT_BLOCKS * BLOCK
    assert node_step_deal(10 ** 6, [(0, 3), (3, 6)], BLOCK) == [(0, segment), (segment, 10 ** 6)]
    assert node_step_deal(10 ** 6, [(0, 2), (2, 4), (4, 6)], BLOCK) == [(0, segment), (0, 0), (segment, 10 ** 6)]
    assert node_step_deal(10 ** 6, [(0, 6)], BLOCK) == [(0, 10 ** 6)]
    assert node_step_deal(10 ** 6, [(0, 0), (0, 6), (6, 6)], BLOCK) == [(0, 0), (0, 10 ** 6), (0, 0)]
    assert node_step_deal(51, [(0, 3), (3, 6)], BLOCK) == [(0, 0), (0, 51)]  # under two segments: the last steps it all
    for size in (10 ** 6, 10 ** 7, 4 * segment, 4 * segment + 1):
        (_, cut), (start, end) = node_step_deal(size, [(0, 1), (1, 2)], BLOCK)
        assert cut == start and end == size and cut % segment == 0 and size - cut >= size / 2
    # with optimizer state (Adam: 2 vectors) every member steps, in whole segments, as many slices as there are
    # (the last slice to the node ending the chain, which keeps it unpublished; fewer slices than members: the
    # first ranks step nothing)
    deal = node_step_deal(10 ** 6, [(0, 1)] * 8, BLOCK, state_vectors=2)
    assert deal[:4] == [(0, 0)] * 4
    assert deal[4:] == [(0, segment), (segment, 2 * segment), (2 * segment, 3 * segment), (3 * segment, 10 ** 6)]
    assert node_step_deal(51, [(0, 3), (3, 6)], BLOCK, state_vectors=2) == [(0, 0), (0, 51)]
    assert node_step_deal(51, [(0, 3), (3, 6), (6, 6)], BLOCK, state_vectors=2) == [(0, 0), (0, 51), (0, 0)]


def published(tmp_path: Path, *, update: int = 7, attempt: int = 0) -> tuple[PartialSum, Path]:
    chain = PartialSum(tmp_path, update=update, attempt=attempt, version=6, size=BLOCK + 10, segment_blocks=1)
    record = chain.record(1)
    record["values"][0] = np.arange(10, dtype=np.float32)
    return chain, chain.write(3, 1, record)


def test_a_partial_is_read_back_whole_and_never_replaced(tmp_path: Path) -> None:
    chain, path = published(tmp_path)
    inode = path.stat().st_ino
    assert chain.read(3, 1, chain.record(1))["values"][0].tolist() == list(range(10))
    again = chain.record(1)
    again["values"][0] = 99.0
    chain.write(3, 1, again)  # a second writer of the same partial (it would hold the same bits): ours stays
    assert path.stat().st_ino == inode
    assert chain.read(3, 1, chain.record(1))["values"][0].tolist() == list(range(10))
    assert sorted(os.listdir(tmp_path)) == [path.name]  # no temporary name left


def test_a_partial_of_another_update_or_attempt_is_never_used(tmp_path: Path) -> None:
    old, path = published(tmp_path, update=6)
    for other in (PartialSum(tmp_path, update=7, attempt=0, version=6, size=BLOCK + 10, segment_blocks=1),
                  PartialSum(tmp_path, update=6, attempt=1, version=6, size=BLOCK + 10, segment_blocks=1),
                  PartialSum(tmp_path, update=6, attempt=0, version=5, size=BLOCK + 10, segment_blocks=1)):
        target = other.path(3, 1)
        if target != path:
            shutil.copy(path, target)
        with pytest.raises(StalePartial, match="never used") as caught:
            other.read(3, 1, other.record(1))
        assert str(target) in str(caught.value)
        if target != path:
            os.unlink(target)


def test_a_damaged_or_short_partial_is_refused(tmp_path: Path) -> None:
    chain, path = published(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40  # a bit of the last value
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptFileError, match="block 0 does not match its digest"):
        chain.read(3, 1, chain.record(1))
    path.write_bytes(bytes(data[:-4]))
    with pytest.raises(CorruptFileError, match="not a whole partial sum"):
        chain.read(3, 1, chain.record(1))
    data[-3] ^= 0x40
    path.write_bytes(bytes(data) + b"\0")
    with pytest.raises(CorruptFileError, match="not a whole partial sum"):
        chain.read(3, 1, chain.record(1))


def test_a_partial_that_is_not_a_regular_file_or_is_gone_is_a_clear_error(tmp_path: Path) -> None:
    chain, path = published(tmp_path)
    os.unlink(path)
    with pytest.raises(CorruptFileError, match="the partial sum is gone"):
        chain.read(3, 1, chain.record(1))
    os.mkfifo(path)  # a FIFO would block a plain open forever
    with pytest.raises(CorruptFileError, match="expected a partial sum, found"):
        chain.read(3, 1, chain.record(1))


def test_a_partial_that_never_comes_is_a_clear_error(tmp_path: Path) -> None:
    chain = PartialSum(tmp_path, update=7, attempt=0, version=6, size=10)
    with pytest.raises(MemtrainError, match="first 4 tasks of update 7 .* not published in time") as caught:
        chain.wait(4, 0, time.monotonic() + 0.05)
    assert "lost" in str(caught.value)
