"""A replay (``memtrain train --replay RUN``): a run's lineage executed again, every version checked.

``Replay`` is the server's whole-vector engine (``ServerSteps``, train/loops/overlap.py) with the lineage's
``Recorded`` schedule, run once over the whole record: its first version's checksum is checked before any
step, each later one as it is published (schedule.RecordedAgenda)."""

from __future__ import annotations

from memtrain.errors import plural
from memtrain.files import read_jsonl
from memtrain.layout import RUN_LINEAGE
from memtrain.train.loops.mapped import RoundFiles
from memtrain.train.records.lineage import Lineage
from memtrain.train.records.state import Position
from memtrain.train.schedule import Recorded, replay_mismatch
from memtrain.train.server.engines import EngineContext, ServerSteps


class Replay(ServerSteps):
    """``lineage``'s run again: its steps with their recorded versions, order and learning rates."""

    def __init__(self, context: EngineContext, *, files: RoundFiles, lineage: Lineage):
        super().__init__(context, files=files, schedule=Recorded(lineage.steps, lineage.path))
        self.lineage = lineage
        self.ran = False

    def run(self, position: Position) -> None:
        """The whole record, from version 0 (this run's, checked against the record's first)."""
        lineage = self.lineage
        found = read_jsonl(self.context.run_path / RUN_LINEAGE)[0].get("checksum")
        if lineage.init_checksum is not None and found != lineage.init_checksum:
            raise replay_mismatch(0, lineage.init_checksum, found, lineage.path)
        self.context.log(f"replay of {lineage.path.parent}: {plural(len(lineage.steps), 'update')}")
        self.ran = True
        super().run(position)

    def epoch_done(self, position: Position) -> bool:
        """Once run, the record is done: its epochs are the lineage's, one evaluation at its end."""
        return self.ran
