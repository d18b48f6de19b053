"""The desk's bookkeeping on its own (memtrain/train/loops/desk.py): taking tasks, grouping gradients in arrival order
and the staleness bound, on a real desk file in a temporary folder, with no worker process and no model."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from memtrain.train.exchange.marks import Board
from memtrain.train.loops.desk import (
    DISCARDED,
    GROUPS,
    HANDED,
    NEWEST,
    NEXT,
    PENDING,
    REDO,
    DeskParticipant,
    create_desk,
)
from memtrain.train.loops.maps import MapCache
from memtrain.train.messages import Loop, Stretch
from memtrain.train.plan import Plan

SIZE, TASKS, GROUP, BOUND, VERSION = 8, 6, 2, 1, 10


def desk_of(tmp_path: Path, participants: int = 2) -> list[DeskParticipant]:
    """A stretch's desk at version 10 over the first TASKS tasks of epoch 0, and its participants."""
    plan = Plan(600, 100, 2, 0, 1, shuffle="batches")  # 6 updates of 2 tasks: 12 tasks in the epoch's stream
    create_desk(tmp_path, SIZE, participants, GROUP, np.arange(TASKS, dtype=np.int64), VERSION)
    files = SimpleNamespace(exchange=tmp_path, plan=plan, setup=SimpleNamespace(epochs=1), maps=MapCache(),
                            size=SIZE, board=Board(participants))
    return [DeskParticipant(files, Stretch(generation=1, epoch=0, first=0, stop=3, version=VERSION, slot=slot,
                                           participants=participants, slices=0, loop=Loop.DESK, group=GROUP,
                                           max_staleness=BOUND), alive=lambda: None)
            for slot in range(participants)]


def test_tasks_are_taken_in_list_order_at_the_newest_version_and_claimed(tmp_path: Path) -> None:
    first, second = desk_of(tmp_path)
    assert first.take() == (0, VERSION) and second.take() == (1, VERSION)
    assert first.desk.claims.tolist() == [[0, VERSION], [1, VERSION]]
    assert int(first.desk.words[NEXT]) == 2


def test_gradients_group_in_arrival_order_and_a_full_group_is_handed_to_the_last_poster(tmp_path: Path) -> None:
    first, second = desk_of(tmp_path)
    first.take(), second.take()
    assert second.post(1, VERSION, 0, 0.5, 0.01) is None, "a group of 1 of 2 waits to fill"
    assert int(second.desk.words[PENDING]) == 1
    assert first.post(0, VERSION, 0, 0.25, 0.02) == (0, [(1, 0), (0, 0)]), "handed over: arrival order"
    record = first.records[0]
    assert int(record["count"]) == 2 and record["index"].tolist() == [1, 0] and record["at"].tolist() == [10, 10]
    assert record["loss"].tolist() == [0.5, 0.25]
    words = first.desk.words
    assert int(words[HANDED]) == 1 and int(words[PENDING]) == 0 and first.desk.claims.tolist() == [[-1, -1]] * 2
    assert first.desk.busy[0, 0] == 1 and first.desk.busy[1, 0] == 1, "the buffers wait for the step"


def test_a_gradient_beyond_the_bound_goes_back_to_be_computed_again(tmp_path: Path) -> None:
    """The bound is against the version the group will step from: the newest, plus the groups handed over and
    not stepped yet."""
    (first, _) = desk_of(tmp_path)
    words = first.desk.words
    words[HANDED] = 1  # one group handed over, not stepped: the next group steps from version 11
    assert first.post(3, VERSION - 1, 0, 0.1, 0.01) is None  # 11 - 9 = 2 > 1: stale
    assert int(words[REDO]) == 1 and int(first.desk.redo[0]) == 3 and int(words[DISCARDED]) == 1
    assert int(words[PENDING]) == 0 and first.desk.busy[0, 0] == 0, "never added, its buffer free"
    assert first.take() == (3, VERSION), "a task to compute again is taken before the list's next"
    assert first.post(3, VERSION, 0, 0.1, 0.01) is None  # 11 - 10 = 1: within the bound, it joins
    assert int(words[PENDING]) == 1


def test_the_epochs_last_gradient_hands_over_a_short_group_with_its_discard_count(tmp_path: Path) -> None:
    (first, _) = desk_of(tmp_path)
    words = first.desk.words
    words[NEXT], words[DISCARDED] = TASKS, 2  # every task taken, none to redo, no claim left but this one
    assert first.post(5, VERSION, 1, 0.3, 0.01) == (0, [(0, 1)])
    assert int(first.records[0]["count"]) == 1 and int(first.records[0]["discarded"]) == 2
    assert int(words[DISCARDED]) == 0 and int(words[GROUPS]) == 0 and int(words[NEWEST]) == VERSION
