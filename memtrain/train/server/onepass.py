"""An additive model's fit (``OnePass``): one pass of sufficient statistics, summed in task order, then solved.

The engine of an additive model (train/loops/additive.py: the worker's side and the files): its one
"update" is the solve, which publishes version 1, whatever ``train.epochs`` says (advice.one_pass_note).
Partials a killed earlier start left whole are not computed again; once the solved weights are checkpointed
the pass's files go (``epoch_ended``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memtrain.errors import plural
from memtrain.train.context import ModelContext
from memtrain.train.exchange.weights import publish_params
from memtrain.train.loops.additive import PassPlan, StatisticsPass, contract_note, plan_chunk_rows, solve
from memtrain.train.messages import StatsTask, Task
from memtrain.train.plan import split_range
from memtrain.train.records.lineage import solve_record
from memtrain.train.records.state import Position
from memtrain.train.server.engines import EngineContext, EpochEngine


class OnePass(EpochEngine):
    """``model``: the server's model context (the model, its layout and its statistics' layout); ``kind``: its
    name (``model.kind``); ``source``: what the partials depend on besides the plan (additive.pass_source);
    ``record``: appends the solve's lineage record."""

    def __init__(self, context: EngineContext, *, model: ModelContext, kind: str, source: str,
                 record: Callable[[dict[str, Any]], None]):
        self.context, self.model, self.kind, self.record = context, model, kind, record
        rows = context.plan.train_rows
        self.statistics = StatisticsPass(context.run_path, PassPlan(
            tasks=tuple(split_range(0, rows, context.train.tasks_per_update)),
            chunk_rows=plan_chunk_rows(model.model, context.train.chunk_rows, rows),
            size=model.stats_layout.size, source=source), context.log, describe_rows=context.describe_rows)

    def run(self, position: Position) -> None:
        """The pass's tasks not kept from an earlier start, their partials summed, the sum solved: version 1."""
        c, plan = self.context, self.statistics.plan
        note = contract_note(self.model.model, self.kind, plan)
        if note:
            c.log(note)
        kept = self.statistics.start()
        if kept:
            c.log(f"statistics: {len(kept)} of {plural(len(plan.tasks), 'partial')} kept from an earlier start")
        tasks = [StatsTask(task=i, attempt=0, lo=lo, hi=hi, chunk_rows=plan.chunk_rows)
                 for i, (lo, hi) in enumerate(plan.tasks) if i not in kept]
        results = c.scheduler.run(c.placement.transport, tasks)
        partials = kept | {r.task: self.statistics.partial_path(r.task, r.attempt) for r in results}
        params = solve(self.model.model, self.kind, self.model.stats_layout.views(self.statistics.summed(partials)))
        checksum = publish_params(c.run_path, 1, self.model.layout, params,
                                  made_by=f"the solve of model {self.kind!r}")
        del params
        self.record(solve_record(tasks=list(plan.tasks), solve=self.kind, checksum=checksum))
        position.version, position.epoch_rows = 1, c.plan.train_rows

    def epoch_done(self, position: Position) -> bool:
        """Solved (a resume finds version 1 in its checkpoint): the pass is not run again."""
        return position.version > 0

    def epoch_ended(self, position: Position) -> None:
        self.statistics.clear()  # the checkpoint holds the solved weights: the pass's files are not needed

    def discard(self, task: Task) -> None:
        """A dead or superseded statistics task: its partial (if it published one) and its temporary file."""
        if isinstance(task, StatsTask):
            self.statistics.discard(task.task, task.attempt)
