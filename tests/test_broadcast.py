"""The broadcast round's scheduler plugin (memtrain/cluster/broadcast.py ``BroadcastPlugin``) on its own:
records, answers, counts and the ways a wave ends, on an asyncio loop with a stand-in scheduler (the real one runs in
tests/test_cluster.py)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("distributed")

from memtrain.cluster.broadcast import BroadcastPlugin, RoundState, Wave, due_at  # noqa: E402


def board(workers: list[str]) -> BroadcastPlugin:
    plugin = BroadcastPlugin()
    told: list[tuple[str, dict]] = []  # what the plugin publishes to the servers (``BroadcastPlugin.tell``)
    scheduler = SimpleNamespace(handlers={}, workers=dict.fromkeys(workers), told=told,
                                log_event=lambda topic, message: told.append((topic, message)))
    asyncio.run(plugin.start(scheduler))
    return plugin


def test_a_wave_is_counted_in_rank_order_and_members_get_the_next_record_with_their_answer() -> None:
    plugin = board(["a", "b"])

    async def run() -> tuple[dict, bytes | None, bytes | None]:
        plugin.begin(ident="r", members=["a", "b"], client="c")
        plugin.post(ident="r", wave=0, record=b"zero")
        assert await plugin.next(ident="r", wave=0) == b"zero"
        later = asyncio.ensure_future(plugin.answer_and_next(ident="r", wave=0, rank=1, numbers=[1, 0.5, 0.1],
                                                             blob=b"BB"))
        first = asyncio.ensure_future(plugin.answer_and_next(ident="r", wave=0, rank=0, numbers=[0, 0.25, 0.2],
                                                             blob=b"A"))
        counted = await plugin.await_count(ident="r", wave=0, seconds=5)
        plugin.post(ident="r", wave=1, record=b"one")
        return counted, await first, await later

    counted, first, later = asyncio.run(run())
    assert counted["status"] == "done" and counted["numbers"] == [0, 0.25, 0.2, 1, 0.5, 0.1]
    assert counted["blob"] == b"ABB" and first == later == b"one"


def test_a_wave_ends_when_a_member_leaves_fails_or_is_late_and_a_member_asking_after_the_end_is_told() -> None:
    async def wave(plugin: BroadcastPlugin, answers: dict[int, str], **rule: float) -> dict:
        plugin.begin(ident="r", members=["a", "b", "c"], client="c")
        plugin.post(ident="r", wave=0, record=b"x", parts=3)
        for rank, error in answers.items():
            asyncio.ensure_future(plugin.answer_and_next(ident="r", wave=0, rank=rank, numbers=[rank], error=error))
        await asyncio.sleep(0.01)
        return await plugin.await_count(ident="r", wave=0, seconds=2, **rule)

    plugin = board(["a", "b", "c"])
    assert asyncio.run(wave(plugin, {0: "", 1: "boom"}))["status"] == "failed"

    async def left() -> dict:
        waiting = asyncio.ensure_future(wave(plugin, {0: ""}))
        await asyncio.sleep(0.05)
        plugin.remove_worker(None, "b", stimulus_id="test")
        return await waiting

    found = asyncio.run(left())
    assert found["status"] == "left" and found["ranks"] == [0] and found["numbers"] == [0]
    assert ("memtrain-round", {"ident": "r", "kind": "left", "worker": "b"}) in plugin.scheduler.told  # the server told
    started = time.monotonic()
    found = asyncio.run(wave(plugin, {0: "", 2: ""}, ratio=3.0, backup_seconds=0.2))
    assert found["status"] == "late" and found["ranks"] == [0, 2] and 0.2 <= time.monotonic() - started < 1.5
    assert asyncio.run(wave(plugin, {0: ""}, timeout=0.1))["status"] == "timeout"
    plugin.end(ident="r")
    assert asyncio.run(plugin.next(ident="r", wave=1)) is None


def test_a_round_with_a_member_already_gone_ends_at_its_first_wave() -> None:
    plugin = board(["a"])

    async def run() -> dict:
        plugin.begin(ident="r", members=["a", "gone"], client="c")
        plugin.post(ident="r", wave=0, record=b"x")
        return await plugin.await_count(ident="r", wave=0, seconds=2)

    assert asyncio.run(run())["status"] == "left"


def test_the_straggler_rule_counts_each_members_pieces_of_work() -> None:
    """5 tasks on 2 workers: rank 0 does 3, rank 1 does 2. Rank 1 answered after 2 s (1 s a task): rank 0 is
    late at 3 x 3 x 1 s = 9 s, not at 3 x 2 s; a rank dealt nothing (3 slices, 4 workers) counts no time."""
    state = RoundState(members=["a", "b"], client="c")
    state.waves[0] = Wave(record=b"", posted=100.0, parts=5, answers={1: (102.0, [], b"", "")})
    assert due_at(state, 0, 3.0, 0.5, 0.0) == 109.0
    assert due_at(state, 0, 3.0, 20.0, 0.0) == 120.0  # and at least backup_seconds
    assert due_at(state, 0, 3.0, 0.5, 4.0) == 104.0  # or the timeout, whichever comes first
    assert due_at(state, 0, 0.0, 0.5, 0.0) == float("inf")  # no rule: only a timeout ends it
    state = RoundState(members=["a", "b", "c", "d"], client="c")
    state.waves[0] = Wave(record=b"", posted=100.0, parts=3,
                          answers={3: (100.01, [], b"", ""), 1: (101.0, [], b"", ""), 2: (101.0, [], b"", "")})
    assert due_at(state, 0, 3.0, 0.5, 0.0) == 103.0
