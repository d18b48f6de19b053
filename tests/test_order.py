"""memtrain/order.py and memtrain/mixing.py: every epoch is a permutation of the split, fixed by (seed, epoch)
alone, new every epoch, rows shuffled within bounded windows; "batches" is the training plan's order bitwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memtrain.errors import InputError
from memtrain.mixing import mixing, mixing_table
from memtrain.order import BLOCKS_PER_WINDOW, SHUFFLES, epoch_order, rank_part
from memtrain.train.plan import epoch_updates


def epoch_rows(shuffle: str, **job: int) -> np.ndarray:
    order = epoch_order(shuffle, **job)
    return np.concatenate([np.asarray(order.batch(k), dtype=np.int64) for k in range(order.batches)] or [[]])


jobs = st.fixed_dictionaries({"rows": st.integers(0, 3000), "batch_size": st.integers(1, 700),
                              "seed": st.integers(0, 2**32), "epoch": st.integers(0, 1000),
                              "window": st.integers(1, 5000)})


@settings(max_examples=60, deadline=None)
@given(job=jobs, shuffle=st.sampled_from(SHUFFLES))
def test_each_epoch_is_a_permutation_in_batches_of_the_batch_size(job: dict[str, int], shuffle: str) -> None:
    rows = epoch_rows(shuffle, **job)
    np.testing.assert_array_equal(np.sort(rows), np.arange(job["rows"]))
    order = epoch_order(shuffle, **job)
    sizes = [len(order.batch(k)) for k in range(order.batches)]
    assert sizes == [min(job["batch_size"], job["rows"] - k * job["batch_size"]) for k in range(order.batches)] \
        or shuffle == "batches"  # "batches" visits the short last batch wherever the permutation puts it
    assert sorted(sizes) == sorted(min(job["batch_size"], job["rows"] - k * job["batch_size"])
                                   for k in range(order.batches))


@settings(max_examples=40, deadline=None)
@given(job=jobs, shuffle=st.sampled_from(SHUFFLES))
def test_the_same_seed_and_epoch_give_the_same_order_and_any_batch_alone_is_the_same(job: dict[str, int],
                                                                                    shuffle: str) -> None:
    whole = epoch_rows(shuffle, **job)
    np.testing.assert_array_equal(whole, epoch_rows(shuffle, **job))
    order = epoch_order(shuffle, **job)
    if order.batches:
        k = order.batches // 2  # asked first, on a fresh order: no state from the batches before it
        lo = sum(len(epoch_order(shuffle, **job).batch(i)) for i in range(k))
        np.testing.assert_array_equal(np.asarray(order.batch(k)), whole[lo:lo + len(order.batch(k))])


@settings(max_examples=40, deadline=None)
@given(job=jobs.filter(lambda j: j["rows"] >= 200), shuffle=st.sampled_from(("rows", "batches")))
def test_epochs_and_seeds_differ(job: dict[str, int], shuffle: str) -> None:
    if shuffle == "batches" and job["rows"] // job["batch_size"] < 8:
        return  # too few batches to be sure two permutations of them differ
    first = epoch_rows(shuffle, **job)
    assert not np.array_equal(first, epoch_rows(shuffle, **job | {"epoch": job["epoch"] + 1}))
    assert not np.array_equal(first, epoch_rows(shuffle, **job | {"seed": job["seed"] + 1}))


@settings(max_examples=60, deadline=None)
@given(job=jobs)
def test_rows_are_shuffled_within_windows_of_at_most_window_rows_one_block_per_stratum(job: dict[str, int]) -> None:
    order = epoch_order("rows", **job)
    rows = epoch_rows("rows", **job)
    block = order.block_rows
    assert order.window_blocks == min(BLOCKS_PER_WINDOW, job["window"])
    edges = order.window_starts
    assert np.all(np.diff(edges) <= job["window"])
    windows = len(edges) - 1
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        blocks = np.unique(rows[lo:hi] // block)
        assert len(blocks) <= order.window_blocks
        # one block of each stratum (windows consecutive blocks in file order): every window spans the split
        strata = blocks // windows
        assert len(np.unique(strata)) == len(blocks) and len(blocks) >= -(-len(order.block_order) // windows) - 1
        # whole blocks: the window holds every row of each block it touches
        assert hi - lo == sum(min(block, job["rows"] - b * block) for b in blocks.tolist())


def test_a_window_as_large_as_the_split_shuffles_uniformly_and_none_is_file_order() -> None:
    rows = epoch_rows("rows", rows=5000, batch_size=100, seed=3, epoch=0, window=5000)
    assert abs(np.corrcoef(rows, np.arange(5000))[0, 1]) < 0.05  # no trace of file order left
    np.testing.assert_array_equal(epoch_rows("none", rows=50, batch_size=7, seed=3, epoch=9, window=4),
                                  np.arange(50))


@pytest.mark.parametrize(("rows", "batch_size", "drop_last"), [(900, 128, False), (1000, 100, False), (7, 1, False),
                                                               (900, 128, True), (50, 64, False)])
def test_batches_policy_is_the_training_plans_order_bitwise(rows: int, batch_size: int, drop_last: bool) -> None:
    for seed, epoch in ((0, 0), (5, 1), (123, 7)):
        updates = epoch_updates(rows, batch_size, 3, seed, epoch, shuffle="batches")
        plan = [(u.tasks[0].lo, u.tasks[-1].hi) for u in updates]
        if drop_last:
            plan = [(lo, hi) for lo, hi in plan if hi - lo == batch_size]
        order = epoch_order("batches", rows=rows, batch_size=batch_size, seed=seed, epoch=epoch, drop_last=drop_last)
        assert [(r.start, r.stop) for r in map(order.batch, range(order.batches))] == plan


def test_rank_parts_cover_a_batch_in_order_for_any_world() -> None:
    batch = np.arange(100, 137)
    for world in (1, 2, 3, 4, 50):
        parts = [rank_part(batch, r, world) for r in range(world)]
        np.testing.assert_array_equal(np.concatenate(parts), batch)
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert rank_part(range(10, 20), 1, 3) == range(13, 16)  # a contiguous batch stays a range (zero-copy)


def test_bad_orders_are_refused_by_name() -> None:
    with pytest.raises(InputError, match="unknown shuffle.*'rows' or 'batches' or 'none'.*found 'blocks'"):
        epoch_order("blocks", rows=10, batch_size=2, seed=0, epoch=0)
    with pytest.raises(InputError, match=r"window must be an integer from 1 to 2\*\*63 - 1 \(found 0\)"):
        epoch_order("rows", rows=10, batch_size=2, seed=0, epoch=0, window=0)
    with pytest.raises(InputError, match="seed must be an integer from 0 to"):
        epoch_order("rows", rows=10, batch_size=2, seed=-1, epoch=0)
    with pytest.raises(IndexError, match="batch 5 outside an epoch of 5 batches"):
        epoch_order("rows", rows=10, batch_size=2, seed=0, epoch=0).batch(5)


def test_mixing_of_fixed_batches_against_row_shuffling_on_a_class_sorted_split() -> None:
    fixed = mixing("batches", rows=216_000, batch_size=512, classes=10)
    rows = mixing("rows", rows=216_000, batch_size=512, classes=10)
    assert fixed.kept_pairs == 1.0 and fixed.classes_per_batch < 1.1  # today: the same batches, one class each
    assert fixed.uniform_pairs == pytest.approx(0.0024, abs=1e-4)
    assert rows.kept_pairs < 1.5 * rows.uniform_pairs  # nearly as mixed as a uniform shuffle
    assert rows.classes_per_batch > 7
    uniform = mixing("rows", rows=216_000, batch_size=512, classes=10, window=216_000)
    assert uniform.kept_pairs == pytest.approx(uniform.uniform_pairs, rel=0.05) and uniform.classes_per_batch == 10
    docs = (Path(__file__).resolve().parent.parent / "docs" / "loader.md").read_text()
    assert mixing_table() in docs  # the page quotes the figures as printed by `python -m memtrain.mixing`


@pytest.mark.parametrize(("rows", "window"), [(1000, 64), (1001, 64), (70_001, 1 << 16), (5, 64), (129, 3),
                                             (300, 2**40)])
def test_a_windows_rows_are_its_blocks_rows_permuted_as_the_docstring_says(rows: int, window: int) -> None:
    """WindowOrder.window_rows against its specification written out plainly: the window's blocks in order,
    each block's rows (the split's last block shorter), permuted by the generator of (seed, epoch, 1, w)."""
    order = epoch_order("rows", rows=rows, batch_size=7, seed=3, epoch=2, window=window)
    for w in range(len(order.window_starts) - 1):
        blocks = order.block_order[order.block_starts[w]:order.block_starts[w + 1]]
        plain = np.concatenate([np.arange(b * order.block_rows, min((b + 1) * order.block_rows, rows))
                                for b in blocks.tolist()])
        expected = plain[np.random.default_rng([3, 2, 1, w]).permutation(len(plain))]
        np.testing.assert_array_equal(order.window_rows(w), expected)
