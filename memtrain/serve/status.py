"""A jobs folder (+ the live service's view of it) -> a status snapshot (status.json) -> a table or JSON.

The running service rewrites ``DIR/status.json`` atomically every second and on every change. Without a
service, ``memtrain serve --status`` builds the same snapshot from the folders themselves.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rich.table import Table
from rich.text import Text

from memtrain.errors import MemtrainError
from memtrain.files import read_json
from memtrain.inspection.render import elide_middle, elide_words, make_console
from memtrain.layout import spool_job_name
from memtrain.records import SERVE_STATUS, make
from memtrain.serve.runner import progress
from memtrain.serve.spool import Spool, read_state, results, service_alive

STATUS_FORMAT = "memtrain.serve-status"
STATUS_VERSION = 1
SHOWN = 20  # newest done and failed records listed in a snapshot; the counts cover every one


def snapshot(spool: Spool, *, service: dict[str, Any] | None, queued: list[dict[str, Any]],
             running: list[dict[str, Any]]) -> dict[str, Any]:
    """Everything ``--status`` shows, as plain JSON-able data."""
    done_count, done = results(spool.done, SHOWN)
    failed_count, failed = results(spool.failed, SHOWN)
    return make(SERVE_STATUS, format=STATUS_FORMAT, version=STATUS_VERSION, updated_at=time.time(),
                folder=str(spool.folder), service=service,
                counts={"queued": len(queued), "running": len(running), "done": done_count, "failed": failed_count},
                queued=queued, running=running, done=done, failed=failed)


def offline_snapshot(spool: Spool) -> dict[str, Any]:
    """The snapshot of a folder no service is watching: claimed jobs are stopped until one starts."""
    queued = [{"name": spool_job_name(p.name), "file": str(p), "state": "queued"} for p in spool.queued()]
    running = []
    for path in spool.claimed():
        name = spool_job_name(path.name) or path.name
        state = read_state(spool, name)
        run_dir = state.get("run_dir")
        running.append({"name": name, "state": "stopped", "file": str(path), "run_dir": run_dir,
                        "log": str(spool.log(name)), "epochs": state.get("epochs"),
                        "progress": progress(Path(run_dir)) if run_dir else {},
                        "reason": "no service is running; it resumes when one starts"})
    return snapshot(spool, service=None, queued=queued, running=running)


def current(spool: Spool) -> dict[str, Any]:
    """The live service's status.json if one is running, else a snapshot built from the folders."""
    if service_alive(spool) and spool.status_file.exists():
        try:
            found = read_json(spool.status_file, what="status file")
        except MemtrainError:
            found = None
        if isinstance(found, dict) and found.get("format") == STATUS_FORMAT:
            for item in found.get("running", []):  # progress moves between rewrites: read it fresh
                if item.get("run_dir"):
                    item["progress"] = progress(Path(item["run_dir"]))
            return found
    return offline_snapshot(spool)


def show(spool: Spool, *, as_json: bool) -> int:
    """Print the status of a jobs folder (a table, or the snapshot as JSON)."""
    snap = current(spool)
    if as_json:
        print(json.dumps(snap, indent=2))
        return 0
    out = make_console()
    out.print(Text(elide_words(_headline(snap), out.width)))
    out.print(table(snap, out.width))
    return 0


def table(snap: dict[str, Any], width: int) -> Table:
    """The jobs as a table at most ``width`` columns wide (when its words allow). Paths are shown relative to
    the folder (the headline names it) and cut in the middle to fit, never broken mid-word."""
    folder = snap["folder"]
    rows = [(item["state"], item["name"], _progress_text(item),
             item.get("reason") or _relative(item.get("run_dir"), folder), not item.get("reason"))
            for item in snap["running"]]
    rows += [(item["state"], item["name"] or "", "", _relative(item.get("file"), folder), True)
             for item in snap["queued"]]
    rows += [("done", item.get("name", ""), _metrics_text(item.get("final") or {}),
              _relative(item.get("run_dir"), folder), True) for item in snap["done"]]
    rows += [("failed", item.get("name", ""), "", _relative_text(item.get("error", ""), folder), False)
             for item in snap["failed"]]
    state, job, result, detail = _widths(rows, width)
    grid = Table(show_header=True, header_style="bold")
    grid.add_column("state", width=state, no_wrap=True)
    for column, column_width in (("job", job), ("progress / result", result), ("detail", detail)):
        grid.add_column(column, width=column_width, overflow="fold")
    for state_text, name, progress_text, detail_text, is_path in rows:
        grid.add_row(Text(state_text), Text(elide_middle(name, job)), Text(elide_words(progress_text, result)),
                     Text(elide_middle(detail_text, detail) if is_path else elide_words(detail_text, detail)))
    return grid


# The table's frame: "│ " before each of the four columns, " " after each and the closing "│".
FRAME = 4 * 3 + 1
# Narrowest a text column gets before the table is allowed to be wider than the terminal.
NARROWEST = 12


def _widths(rows: list[tuple[str, str, str, str, bool]], width: int) -> tuple[int, int, int, int]:
    """The widths of state, job, progress / result and detail: their natural widths when they fit; else job and
    progress / result get at most a third and a quarter of the room (wrapping at spaces), detail the rest."""
    natural = [max([len(row[k]) for row in rows] + [len(heading)], default=len(heading))
               for k, heading in enumerate(("state", "job", "progress / result", "detail"))]
    room = width - FRAME - natural[0]
    if sum(natural[1:]) <= room:
        return natural[0], natural[1], natural[2], natural[3]
    longest_word = max([len(word) for row in rows for word in row[2].split()] + [NARROWEST])
    job = min(natural[1], max(NARROWEST, room // 3))
    result = min(natural[2], max(longest_word, room // 4))
    return natural[0], job, result, max(NARROWEST, room - job - result)


def _relative(path: str | None, folder: str) -> str:
    """A path inside the jobs folder as relative to it (``runs/NAME``), any other one as it is."""
    if not path:
        return ""
    inside = Path(path).is_relative_to(folder)
    return str(Path(path).relative_to(folder)) if inside else path


def _relative_text(text: str, folder: str) -> str:
    """An error message with the jobs folder's paths written relative to it."""
    return text.replace(folder.rstrip("/") + "/", "")


def _headline(snap: dict[str, Any]) -> str:
    counts = snap["counts"]
    totals = ", ".join(f"{counts[k]} {k}" for k in ("queued", "running", "done", "failed"))
    service = snap.get("service")
    if not service:
        return f"{snap['folder']}: no service running; {totals}"
    age = time.time() - snap["updated_at"]
    return (f"{snap['folder']}: memtrain serve pid {service['pid']} ({service['observer']}, "
            f"at most {service['max_concurrent']} at once), updated {age:.1f} s ago; {totals}")


def _progress_text(item: dict[str, Any]) -> str:
    found = item.get("progress") or {}
    parts = []
    if item.get("epochs"):
        parts.append(f"epoch {found.get('epochs_done') or 0}/{item['epochs']}")
    if found.get("loss") is not None:
        parts.append(f"loss {found['loss']:.4f}")
    return "  ".join(parts)


def _metrics_text(record: dict[str, Any]) -> str:
    keys = ("epoch", "val_loss", "val_accuracy")
    return "  ".join(f"{k} {record[k]:.4g}" if isinstance(record[k], float) else f"{k} {record[k]}"
                     for k in keys if record.get(k) is not None)
