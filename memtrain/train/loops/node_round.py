"""The server's side of a two-level round (issue 42; docs/cluster.md, "The two-level round").

``NodeParticipant`` is the cluster's ``SlicedParticipant`` (train/loops/sliced.py) with one change: when every
member of the broadcast round is a node (its Dask worker started with ``MEMTRAIN_NODE_PROCESSES``:
memtrain/cluster/nodes.py), an update's gradients are asked with a **node record** -- the gradient record and
the members' process counts in rank order -- and the members continue one fold of the update's gradients
across the nodes (train/loops/node_sum.py). The step's slices then read the last partial
(``StepTask.chained``) instead of every gradient file: the same sum, so the same bits. The step wave
(``node-step``) deals the slices by ``plan.node_step_deal``: the node ending the chain steps its own slice
from its memory, never published; a step of that slice anywhere else (the node lost after its answer, a step
sent per task) finds the last partial not whole, and ``step_per_task`` has the tasks after the furthest whole
partial computed again per task first: the same bits.

A round that ends early (a node left, failed or fell silent): the furthest partial whole in every segment at
the end of an answered node's range (``node_sum.resume_point``) is kept, the tasks after it run per task
(attempt 1, files of their own in the shared folder), and the step adds them onto that partial in task order
-- again the in-order fold. Otherwise, and without nodes, everything is ``SlicedParticipant``'s.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

from memtrain.train.exchange.area import SPARE_GRADIENT, STREAMED_GRADIENT, discard
from memtrain.train.exchange.weights import BLOCK
from memtrain.train.loops.mapped import RoundFiles
from memtrain.train.loops.node_sum import PartialSum, node_tasks, resume_point, segment_ranges
from memtrain.train.loops.sliced import SlicedParticipant
from memtrain.train.messages import GradTask, Result, StepTask, Stretch
from memtrain.train.plan import Update, node_step_deal
from memtrain.train.timing import UNTIMED, timed_sections


def node_shares(ranges: list[tuple[int, int]], counts: list[int]) -> list[int]:
    """Each node's share of an update for the straggler rule (``broadcast.due_at``): its tasks per process,
    rounded up -- how many tasks' time it needs with its processes computing side by side -- so a node is one
    unit of the rule: a node of 2 processes given 4 tasks is not late for taking twice one task's time.

    >>> node_shares([(0, 1), (1, 5), (5, 7)], [1, 2, 1])
    [1, 2, 2]
    """
    return [-(-(hi - lo) // count) for (lo, hi), count in zip(ranges, counts, strict=True)]


class NodeParticipant(SlicedParticipant):
    """The server of a cluster run whose round members may be nodes (see the module's docstring)."""

    chained = 0  # tasks of the update to step next whose sum is its chain's partial
    # the update to step next when its gradients went through a round of nodes: (its gradient tasks, where the
    # nodes' ranges end, the step's deal by rank when every node answered -- else None)
    dealt: tuple[list[GradTask], list[int], list[tuple[int, int]] | None] | None = None

    def __init__(self, files: RoundFiles, stretch: Stretch, **options: Any):
        super().__init__(files, stretch, **options)
        if self.broadcast is not None:  # a round of nodes: its waves are files of the exchange area
            self.broadcast.exchange = files.exchange
        timed_sections(self, options.get("timer", UNTIMED), ("node_step",))  # train/timing.py: untimed, nothing
        # per update asked with a node record: its first task and the chain's ends, whose partials (``partials``)
        # are removed after its step; their names are made only when the server removes them itself
        self.published: dict[int, tuple[GradTask, list[int]]] = {}

    def member_processes(self) -> list[int]:
        """The open round's members' process counts as nodes (asked once per round, when it opens:
        ``Broadcast.node_counts``); [] unless all are nodes."""
        assert self.broadcast is not None
        return self.broadcast.processes

    def gradients(self, update: Update, *, stepped: Update | None = None) -> Update | None:
        """As without nodes, but the gradients of the tasks a chain folded stayed on their nodes (their scratch):
        no file of the exchange to make a spare of or remove after the step -- before, the server tried, one
        rename of a missing file per task and update (N x P of them per update)."""
        found = super().gradients(update, stepped=stepped)
        self.received = self.received[self.chained:]
        return found

    def run_gradient_tasks(self, tasks: list[GradTask]) -> list[Result]:
        self.chained, self.dealt = 0, None
        broadcast = self.broadcast
        if broadcast is None or not (broadcast.active or broadcast.open()) or not self.member_processes():
            return super().run_gradient_tasks(tasks)
        from memtrain.cluster.broadcast import gradient_record, gradient_results
        from memtrain.cluster.nodes import CHAIN_SECONDS, node_record

        counts = self.member_processes()
        ranges = node_tasks(len(tasks), counts)
        record = node_record(gradient_record(tasks), counts, broadcast.timeout or CHAIN_SECONDS, broadcast.attempts)
        ends = [hi for _, hi in ranges]
        self.published[tasks[0].ticket] = (tasks[0], ends)  # discarded after the step
        answer = broadcast.ask("nodes", record, node_shares(ranges, counts), self.file_chores)
        found = gradient_results(tasks, answer.numbers)
        deal = node_step_deal(self.files.size, ranges, BLOCK, len(self.state_names))
        self.dealt = (tasks, ends, deal if answer.status == "done" else None)
        if answer.status == "done":
            broadcast.kept = list  # every node started this part: each removed its previous update's partials
            self.chained = len(tasks)
            return [found[task.task] for task in tasks]
        chain = self.chain(tasks[0])
        first_missing = min((t.task for t in tasks if t.task not in found), default=len(tasks))
        self.chained = resume_point(chain, [hi for _, hi in ranges if hi <= first_missing])
        missing = [replace(task, attempt=1, spare="", in_place=False) for task in tasks[self.chained:]]
        if answer.status == "timeout":  # the nodes answer in chain order: those after the first silent one wait for
            # its partial, silent through no fault of theirs; only that one is killed as hung (``kill_silent``)
            first = min(set(range(broadcast.size)) - set(answer.ranks))
            answer = replace(answer, ranks=[rank for rank in range(broadcast.size) if rank != first])
        # the round's leftovers, deleted as soon as its loops have returned (maybe at once): the partials a late
        # member may still write, never the one the step reads (whole already; discarded after the step)
        self.round_over(answer, f"{len(missing)} of {len(tasks)} gradient tasks (after the partial of the first "
                        f"{self.chained})", self.partials(tasks[0], [hi for hi in ends if hi != self.chained]))
        done = {r.task: r for r in self.run_tasks(missing, lambda: None)}
        return [done.get(task.task) or found[task.task] for task in tasks]

    def run_step_tasks(self, tasks: list[StepTask], ranges: list[tuple[int, int]]) -> list[Result]:
        return self.node_step([replace(task, chained=self.chained) for task in tasks], ranges)

    def node_step(self, tasks: list[StepTask], ranges: list[tuple[int, int]]) -> list[Result]:
        """The step's slices, each reading the sum of its update's first ``chained`` tasks from their chain's
        partial (0: every gradient file): section ``node_step`` (train/timing.py)."""
        return super().run_step_tasks(tasks, ranges)

    def node_deal(self) -> list[tuple[int, int]] | None:
        """The step's deal by rank (``plan.node_step_deal``) while the round whose nodes folded the whole
        update is still on; else None (the step is sliced and sent as without nodes)."""
        broadcast = self.broadcast
        if self.dealt is None or self.dealt[2] is None or broadcast is None or not broadcast.active:
            return None
        return self.dealt[2]

    def step_ranges(self, count: int) -> list[tuple[int, int]]:
        deal = self.node_deal()
        return super().step_ranges(count) if deal is None else [(lo, hi) for lo, hi in deal if hi > lo]

    def ask_step(self, broadcast: Any, tasks: list[StepTask], ranges: list[tuple[int, int]]) -> Any:
        """A round of nodes' step wave: the template and the deal (``node_step_deal``: the node ending the chain
        steps its slice from its memory); any other round's as without nodes."""
        deal = self.node_deal()
        if deal is None:
            return super().ask_step(broadcast, tasks, ranges)
        return broadcast.ask("node-step", (replace(tasks[0], task=0, lo=0, hi=0), tuple(deal)),
                             [int(hi > lo) for lo, hi in deal], lambda: None)

    def step_per_task(self, tasks: list[StepTask]) -> list[Result]:
        """The slices per task. The node that ended the chain kept its slice of the last partial unpublished: if
        that partial is not whole (that node was lost, or its round ended, before its step), the furthest whole
        partial at a node's range end is read instead, and the tasks after it are computed again per task
        (attempt 1, as when a node is lost mid-round): the same sum, so the same bits."""
        chained = tasks[0].chained if tasks else 0
        if not chained or self.dealt is None or self.dealt[0][0].ticket != tasks[0].update:
            return super().step_per_task(tasks)
        grads, ends, _ = self.dealt
        whole = resume_point(self.chain(grads[0]), [end for end in ends if end <= chained])
        if whole < chained:
            if self.broadcast is not None:
                self.broadcast.log(f"update {tasks[0].update}: the partial of its first {chained} tasks is not whole "
                                   f"(the node that ended the chain kept its step slice and is gone or its round "
                                   f"ended); tasks {whole}-{chained - 1} computed again per task")
            redo = [replace(task, attempt=1, spare="", in_place=False) for task in grads[whole:chained]]
            done = self.run_tasks(redo, lambda: None)
            self.received += [(STREAMED_GRADIENT.path(self.files.exchange, r_task.ticket, r.task, r.attempt),
                               SPARE_GRADIENT.name(r_task.ticket, r.task, r.attempt))
                              for r_task, r in zip(redo, done, strict=True)]
            taken = {**dict(tasks[0].retried), **{r.task: r.attempt for r in done}}
            retried = tuple(sorted((task, attempt) for task, attempt in taken.items() if attempt))
            tasks = [replace(task, chained=whole, retried=retried) for task in tasks]
        return super().step_per_task(tasks)

    def step(self, update: Update) -> None:
        try:
            super().step(update)
        finally:
            self.discard_partials(update.update)

    def skip(self, update: Update, bad: tuple[int, ...] | list[int]) -> None:
        self.discard_partials(update.update)  # a non-finite loss: no step will read them
        super().skip(update, bad)

    def chain(self, task: GradTask) -> PartialSum:
        return PartialSum(self.files.exchange, update=task.ticket, attempt=0, version=task.version,
                          size=self.files.size)

    def partials(self, task: GradTask, ends: list[int]) -> list[Path]:
        """Every partial file of the update's chain ending at one of ``ends`` (tasks): every segment of it."""
        chain = self.chain(task)
        return [chain.path(hi, s) for hi in ends for s in range(len(segment_ranges(self.files.size)))]

    def discard_partials(self, update: int) -> None:
        """The update's partials, once its step is written (or it was skipped): every one its chain may have
        published (``partials``, kept when its node record was posted). While the round in which every node
        answered is still on, the server removes none: each node removes its own when its next part starts
        (``WorkerState.drop_partials``), and the round's end removes those of the update stepped last
        (``Broadcast.kept``): the server's work per update does not grow with the nodes. Otherwise (a node
        lost, failed or late) every one is removed here."""
        published = self.published.pop(update, None)
        named = functools.partial(self.partials, *published) if published is not None else list
        broadcast = self.broadcast
        if broadcast is not None and self.node_deal() is not None and self.dealt[0][0].ticket == update:
            broadcast.kept = named
        else:
            discard(named())
