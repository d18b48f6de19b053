"""The exchange area's one owner: every kind of file in it, how long it lives and what removes it.

An exchange area is the folder ``memtrain-x-<run id>-<owner pid>/`` (``layout.exchange_dir_name``) that a run's
server makes at start in ``/dev/shm``, in the run directory or in ``run.exchange`` (``make_area``). Every file in it
is of one kind registered in ``KINDS``, with its name (formatted by memtrain/layout.py, which names every file
memtrain writes: this module adds no name of its own, and no other module uses layout.py's names of exchange
files), its lifetime and its remover. Code that makes or opens a file of the exchange gets its path here
(``Kind.path``); code that removes one calls ``discard``; the area goes with ``remove_area``. docs/formats.md's
table of the exchange's files is checked against ``KINDS`` (tests/test_exchange_area.py), and so is every file
a real run leaves when it is killed mid-stretch.

The lifetimes:

    run      made once by the server at the start (the desk's buffers: at the first async stretch) and rewritten
             in place; removed with the area: by the server at its end (a clean end, a stop by a signal or an
             error: ``RunDir.close``), or after a SIGKILL by the next start's sweep (``remove_area`` of an area
             whose owner is dead).
    stretch  made afresh for each stretch (a run of updates handed to every participant at once), replacing
             the previous stretch's, or kept by an engine while it runs (the server's own loop of whole-vector
             steps runs no stretch); removed by the engine when it ends, else with the area.
    update   one update's file on a cluster: made by the server before the update's step, renamed over a run
             file once every slice is written, removed by the server if the step does not finish; or a
             two-level round's partial sum, made by a node and removed by the server after the update's step.
    attempt  one task attempt's file: written by the attempt and removed by the server once it has read it (or
             renamed into another kind); a dead, superseded or too stale attempt's is removed by the server.

A temporary name (``layout.tmp_sibling``: ``.<name>.tmp-<pid>-<8 hex>``) of a registered kind is a file being
written; a writer killed mid-write leaves it until the area is removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from memtrain import layout

LIFETIMES = ("run", "stretch", "update", "attempt")


@dataclass(frozen=True)
class Kind:
    """One kind of exchange file. ``templates``: its names as docs/formats.md writes them (``N`` a digit,
    ``<...>`` a word); ``name``: layout.py's function (or constant) that makes them."""

    templates: tuple[str, ...]
    name: Callable[..., str]
    lifetime: str
    made_by: str
    removed_by: str

    def path(self, exchange: Path, *numbers: int | str) -> Path:
        """Where this kind's file of ``numbers`` lives in ``exchange``."""
        return exchange / self.name(*numbers)

    @cached_property
    def regex(self) -> re.Pattern[str]:
        """Its templates as one regex, compiled at its first use and kept: ``discard`` asks ``kind_of`` for every
        file it removes, on an update's path (a stretch's spares, a too stale gradient, an evaluation's
        metrics), where building the 16 kinds' regexes at each call cost 0.3 ms a file."""
        return re.compile("|".join(f"(?:{template_regex(template).pattern})" for template in self.templates))

    def matches(self, name: str) -> bool:
        return self.regex.fullmatch(name) is not None


def template_regex(template: str) -> re.Pattern[str]:
    """``g-tNNNNN.npy`` -> ``g-t`` + 5 digits + ``.npy``; ``<0|1>`` -> one of those; ``<state>`` -> one word."""
    regex = ""
    for part in re.split(r"(<[^>]+>|N{3,})", template):
        if part.startswith("<") and "|" in part:
            regex += "(?:" + "|".join(map(re.escape, part[1:-1].split("|"))) + ")"
        elif part.startswith("<"):
            regex += r"[^/]+"
        elif re.fullmatch(r"N{3,}", part):
            regex += rf"\d{{{len(part)}}}"
        else:
            regex += re.escape(part)
    return re.compile(regex)


def _constant(value: str) -> Callable[[], str]:
    return lambda: value


WITH_AREA = "with the area"
MARK = Kind((layout.EXCHANGE_MARK,), _constant(layout.EXCHANGE_MARK), "run", "make_area, first", WITH_AREA)
GRADIENT_BUFFER = Kind(("g-tNNNNN.npy", "g-tNNNNN-b1.npy"), layout.gradient_buffer_name, "run",
                       "server.create_round_files", WITH_AREA)
DIGESTS = Kind((layout.WEIGHT_DIGESTS,), _constant(layout.WEIGHT_DIGESTS), "run",
                      "weights.create_digests", WITH_AREA)
BOARD = Kind((layout.ROUND_BOARD,), _constant(layout.ROUND_BOARD), "run", "server.create_round_files",
                   WITH_AREA)
RECORDS = Kind((layout.ROUND_RECORDS,), _constant(layout.ROUND_RECORDS), "run", "server.create_round_files",
                     WITH_AREA)
OPTIMIZER_STATE = Kind(("opt-<state>-<0|1>.npy",), layout.state_buffer_name, "run", "state.start_fresh, state.resume",
                       WITH_AREA)
DESK_BUFFER = Kind(("d-sNNN-bNNN.npy",), layout.desk_buffer_name, "run", "desk.create_desk", WITH_AREA)
DESK_WORDS = Kind((layout.ASYNC_DESK,), _constant(layout.ASYNC_DESK), "stretch", "desk.create_desk",
                  "desk.create_desk (the next stretch's), or with the area")
DESK_TASKS = Kind((layout.ASYNC_TASKS,), _constant(layout.ASYNC_TASKS), "stretch", "desk.create_desk",
                   "desk.create_desk (the next stretch's), or with the area")
DESK_RECORDS = Kind((layout.ASYNC_RECORDS,), _constant(layout.ASYNC_RECORDS), "stretch", "desk.create_desk",
                     "desk.create_desk (the next stretch's), or with the area")
SPARE_GRADIENT = Kind(("g-sNNNNNNNN-tNNNNN-aNNN.npy",), layout.spare_gradient_name, "stretch",
                      "overlap.apply, sliced (renamed from a stepped gradient)",
                      "a later task (renamed into its gradient), or the engine's end (overlap.close, sliced.run)")
STATE_BUILDING = Kind(("opt-<state>-nNNNNNNNN.npy",), layout.state_building_name, "update", "sliced.ready_state",
                      "renamed over opt-<state>-<0|1>.npy, or sliced.discard_state")
CHAIN_SUM = Kind(("c-uNNNNNNNN-aNNN-tNNNNN-sNNNNN.npy",), layout.chain_sum_name, "update",
                 "node_sum.PartialSum.write (a node of a two-level round)",
                 "the node that wrote it, after its answer to the next update (WorkerState.drop_partials); the "
                 "server once the update is stepped or skipped if a node was lost, failed or late "
                 "(node_round.NodeParticipant.discard_partials), else when the round ends (Broadcast.kept)")
STREAMED_GRADIENT = Kind(("g-uNNNNNNNN-tNNNNN-aNNN.npy",), layout.streamed_gradient_name, "attempt",
                         "stream.StreamedGradient (a worker)",
                         "renamed into a spare once stepped; too stale, dead or superseded: the server (discard)")
METRICS = Kind(("m-vNNNNNNNN-tNNNNN-aNNN.npy",), layout.metrics_name, "attempt",
               "metrics.write_task_statistics (a worker)",
               "metrics.collect (the server, once added); a dead or superseded attempt's: the server (discard)")
WAVE = Kind(("w-<round>-NNNNNNNN.json", "w-<round>-NNNNNNNN-rNNNNN.json", "w-<round>-NNNNNNNN-all.json",
             "w-<round>-end.json"),
            layout.wave_file_name, "attempt",
            "broadcast.WaveFiles (a round of nodes: the server a wave's record and the round's end, a node its "
            "answer, the node that completed a wave every answer to it in one file)",
            "a node: its answer, and the one file of answers it wrote, when it answers the next wave; the server: "
            "a record once the next is posted, the answers to a wave not every member answered once it settled, "
            "the rest once the round's loops returned (broadcast.Broadcast.sweep)")
CLUSTER_PROBE = Kind((".cluster-probe-<token>.json",), layout.cluster_probe_name, "attempt",
                     "sharedfs.look (a Dask worker, at start)", "sharedfs.read_back (the server, once read)")

KINDS = (MARK, GRADIENT_BUFFER, DIGESTS, BOARD, RECORDS, OPTIMIZER_STATE, DESK_BUFFER, DESK_WORDS, DESK_TASKS,
         DESK_RECORDS, SPARE_GRADIENT, STATE_BUILDING, CHAIN_SUM, STREAMED_GRADIENT, METRICS, WAVE, CLUSTER_PROBE)


def kind_of(name: str) -> Kind | None:
    """The kind of the exchange file ``name`` (a temporary name counts as its target's), or None: not one of
    the exchange's."""
    target = layout.tmp_target(name) or name
    return next((kind for kind in KINDS if kind.matches(target)), None)


def discard(paths: Iterable[Path]) -> None:
    """Remove exchange files their engine is done with; one already gone is no error. A name no kind registers
    is refused (memtrain removes only what it knows it wrote)."""
    for path in paths:
        if kind_of(path.name) is None:
            raise ValueError(f"{path.name!r} is not a file of the exchange area (train/exchange/area.py KINDS)")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def make_area(parent: Path, run_id: str) -> Path:
    """A new exchange area in ``parent``, its mark written first (what proves the directory is memtrain's)."""
    exchange = parent / layout.exchange_dir_name(run_id, os.getpid())
    exchange.mkdir()
    MARK.path(exchange).write_text(json.dumps({"owner": os.getpid()}) + "\n")
    return exchange


def remove_area(folder: Path) -> bool:
    """Delete an exchange area, every file in it, only if memtrain's mark is in it (a directory that merely has
    the name stays). True if it was removed."""
    if folder.is_symlink() or not MARK.path(folder).is_file():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    return True
