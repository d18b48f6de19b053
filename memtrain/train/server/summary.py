"""A ``TrainSummary`` -> a short table of how the run ended: ``str(summary)``, and HTML for a notebook.

::

    TrainSummary: 8 epochs, weight version 104, 3.2 s, run runs/digits-api
             epoch  loss    val_loss  val_accuracy  val_macro_f1
    best         6  0.0912  0.0843    0.9833        0.9832
    final        8  0.0601  0.0871    0.9778        0.9776
"""

from __future__ import annotations

import html
from typing import Any

from memtrain.errors import plural
from memtrain.train.records.metrics import SHOWN


def _head(summary: Any) -> str:
    parts = [plural(summary.epochs, "epoch") + (f" (stopped early by {summary.monitor})" if summary.stopped_early
                                                else ""),
             f"weight version {summary.version}", f"{summary.seconds:.1f} s"]
    if summary.worker_deaths:
        parts.append(f"{plural(summary.worker_deaths, 'worker')} died and replaced")
    return f"TrainSummary: {', '.join(parts)}, run {summary.run_dir}"


def _rows(summary: Any) -> tuple[list[str], list[list[str]]]:
    """The table's columns and its rows (best, final), each cell a short text."""
    records = [(label, record) for label, record in (("best", summary.best), ("final", summary.final)) if record]
    columns = ["epoch", "loss", *(k for k in SHOWN if any(k in r for _, r in records))]
    rows = [[label, *(_cell(record.get(key)) for key in columns)] for label, record in records]
    return columns, rows


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def summary_text(summary: Any) -> str:
    columns, rows = _rows(summary)
    header = ["", *columns]
    widths = [max(len(line[i]) for line in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
             for line in [header, *rows]]
    return "\n".join([_head(summary), *(lines if rows else [])])


def summary_html(summary: Any) -> str:
    columns, rows = _rows(summary)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in ["", *columns])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<p>{html.escape(_head(summary))}</p><table><tr>{head}</tr>{body}</table>"
