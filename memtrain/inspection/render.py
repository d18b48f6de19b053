"""A view dict -> rich tables on stdout, for people. Every cell is plain text (names are never read as markup)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

from memtrain.errors import plural
from memtrain.train.records.counters import ONE_PASS

# Width of the text lines when stdout is not a terminal (a pipe, a log) and COLUMNS is not set; tables are printed
# whole there, at their own width. COLUMNS, when set, is the width everywhere, tables included (the tests set
# COLUMNS=80 to see what an 80-column terminal shows).
PIPE_WIDTH = 200
STAT_COLUMNS = ("min", "max", "mean", "std", "l2", "nan", "inf")
NOT_CHECKED = "not checked"


def make_console() -> Console:
    """stdout for people: the terminal's width (or COLUMNS), else ``PIPE_WIDTH``; names are never read as markup."""
    console = Console(highlight=False, markup=False, emoji=False)
    if not fits_width(console):
        console = Console(highlight=False, markup=False, emoji=False, width=PIPE_WIDTH)
    return console


def fits_width(console: Console) -> bool:
    """Whether ``console`` has a width its tables must fit: a terminal's, or COLUMNS. A pipe or a log has
    none: its tables are printed whole at their own width, one row per line."""
    return console.is_terminal or "COLUMNS" in os.environ


@dataclass(frozen=True)
class Grid:
    """A titled table of text cells, laid out by ``print_table`` to fit the console.

    ``keys``: how many leading columns name a row (``name``; ``split`` and ``#``): when the table is split to
    fit, every part repeats them, so that each row can be followed from part to part.
    """

    title: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right: frozenset[str] = frozenset()
    keys: int = 1

    def widths(self) -> list[int]:
        return [max([cell_len(column)] + [cell_len(row[k]) for row in self.rows])
                for k, column in enumerate(self.columns)]


SEPARATOR = 3  # " │ " between two columns (no edges)
ROW = "row"  # the row number's column, when a table split to fit has keys too wide to repeat


def table(title: str, columns: Iterable[str], rows: Iterable[Iterable[Any]], right: Iterable[str] = (),
          keys: int = 1) -> Grid:
    """A titled table for ``print_table``: cells that are not text are written by ``num``; ``keys``: see ``Grid``."""
    return Grid(title, tuple(columns), tuple(tuple(cell if isinstance(cell, str) else num(cell) for cell in row)
                                             for row in rows), frozenset(right), keys)


def print_table(console: Console, grid: Grid) -> None:
    """Print ``grid`` so that it fits the console, never squeezing a cell.

    Squeezed, rich shortens cells to "…", gives narrow columns no width at all, or breaks a number across
    two lines. Here a table that fits is printed whole (a wide terminal, a pipe: today's full table);
    one that does not is cut into parts of whole columns, each part repeating the row's key columns and
    as wide as the console allows; a single column too wide even alone beside the keys (a checksum, a
    path) has its cells cut in the middle (``xxh3-128:a1e19f…cdc74d``). ``--json`` has every value whole.
    """
    console.print(Text(""))
    console.print(Text(grid.title, style="bold"))
    limit = console.width if fits_width(console) else None
    for k, part in enumerate(parts(grid, limit)):
        if k:
            console.print(Text(""))
        rendered = _rich_table(part)
        width = sum(part.widths()) + SEPARATOR * (len(part.columns) - 1)
        Console(file=console.file, width=max(width, console.width), force_terminal=console.is_terminal,
                highlight=False, markup=False, emoji=False).print(rendered)


def parts(grid: Grid, limit: int | None) -> list[Grid]:
    """``grid`` as one or more grids of at most ``limit`` columns (characters), each with the key columns."""
    widths = grid.widths()

    def width(columns: list[int]) -> int:
        return sum(widths[c] for c in columns) + SEPARATOR * (len(columns) - 1)

    every = list(range(len(grid.columns)))
    if limit is None or width(every) <= limit:
        return [grid]
    if grid.columns[0] != ROW and width(every[:grid.keys]) > limit // 2:
        # keys too wide to repeat (a bench's method labels): number the rows instead
        return parts(numbered(grid), limit)
    keys = every[:grid.keys]
    groups: list[list[int]] = [[]]
    for column in every[grid.keys:]:
        if groups[-1] and width(keys + groups[-1] + [column]) > limit:
            groups.append([])
        groups[-1].append(column)
    return [_narrowed(_columns(grid, keys + group), limit) for group in groups]


def numbered(grid: Grid) -> Grid:
    """``grid`` with a row number in front, its only key: the first part shows the old keys beside it."""
    return Grid(grid.title, (ROW, *grid.columns), tuple((str(k), *row) for k, row in enumerate(grid.rows, 1)),
                grid.right | {ROW}, 1)


def _columns(grid: Grid, columns: list[int]) -> Grid:
    return Grid(grid.title, tuple(grid.columns[c] for c in columns),
                tuple(tuple(row[c] for c in columns) for row in grid.rows), grid.right, min(grid.keys, len(columns)))


def _narrowed(grid: Grid, limit: int) -> Grid:
    """A part still wider than ``limit`` (one column beside the keys): its widest column's cells cut in the
    middle until it fits (a checksum, a path: text, never a number)."""
    widths = grid.widths()
    excess = sum(widths) + SEPARATOR * (len(widths) - 1) - limit
    if excess <= 0:
        return grid
    widest = max(range(len(widths)), key=widths.__getitem__)
    room = max(1, widths[widest] - excess)
    cut = [tuple(elide_middle(cell, room) if c == widest else cell for c, cell in enumerate(row))
           for row in grid.rows]
    columns = tuple(elide_middle(name, room) if c == widest else name for c, name in enumerate(grid.columns))
    return Grid(grid.title, columns, tuple(cut), grid.right, grid.keys)


def _rich_table(grid: Grid) -> Table:
    result = Table(show_edge=False, pad_edge=False)
    for column in grid.columns:
        result.add_column(Text(column), justify="right" if column in grid.right else "left", no_wrap=True)
    for row in grid.rows:
        result.add_row(*(Text(cell) for cell in row))
    return result


def num(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def size(value: int | None) -> str:
    if value is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def elide_middle(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, cut in the middle (``/home/me/jo…/runs/digits-mlp``): the end of
    a path (its file) and its start stay readable, where rich would break it mid-word or cut its end."""
    if len(text) <= width:
        return text
    head = max(0, (width - 1) // 3)
    return text[:head] + "…" + text[len(text) - (width - 1 - head):]


def elide_words(text: str, width: int) -> str:
    """Every word of ``text`` longer than ``width`` cut in the middle, so that wrapping at spaces never has to
    break a word (a path in an error message)."""
    return " ".join(elide_middle(word, width) for word in text.split(" "))


def metric(value: Any) -> str:
    """A loss or accuracy in a table: four significant digits (the lines above it and --json have them all)."""
    return f"{value:.4g}" if isinstance(value, float) else num(value)


def verified(value: bool | None) -> str:
    return NOT_CHECKED if value is None else "ok" if value else "FAILED"


def lines(console: Console, pairs: Iterable[tuple[str, Any]]) -> None:
    for label, value in pairs:
        if value is not None:
            console.print(Text(f"{label}: ", style="bold") + Text(value if isinstance(value, str) else num(value)))


def render(view: dict[str, Any], console: Console | None = None) -> None:
    console = console or make_console()
    renderers: dict[str, Callable[[dict[str, Any], Console], None]] = {
        "dataset": render_dataset, "run": render_run, "diff": render_diff, "lineage": render_lineage,
        "export": render_written, "plot": render_written}
    if view["kind"].startswith("rl-"):  # a reinforcement-learning run (memtrain/rl/inspect.py)
        from memtrain.rl.inspect import render_rl_checkpoint, render_rl_lineage, render_rl_run

        renderers |= {"rl-run": render_rl_run, "rl-lineage": render_rl_lineage, "rl-checkpoint": render_rl_checkpoint}
    renderers.get(view["kind"], render_tensors)(view, console)
    if "verify" in view:
        render_verify(view["verify"], console)


def render_dataset(view: dict[str, Any], console: Console) -> None:
    x, y = view["x"] or {}, view["y"] or {}
    lines(console, [("dataset", view["path"]), ("task", view["task"]), ("rows", view["rows"]),
                    ("features", f"shape {tuple(x.get('shape', []))} {x.get('dtype')}"),
                    ("targets", f"shape {tuple(y.get('shape', []))} {y.get('dtype')}"),
                    ("splits", ", ".join(f"{name} {plural(s['rows'], 'row')} in {plural(len(s['shards']), 'shard')}"
                                         for name, s in view["splits"].items()))])
    shards = [(name, s["index"], s["rows"], size(s["x_bytes"]), size(s["y_bytes"]), s["x"], verified(s["verified"]))
              for name, split in view["splits"].items() for s in split["shards"]]
    print_table(console, table("shards", ("split", "#", "rows", "x bytes", "y bytes", "x file", "checksum"),
                               shards, right=("#", "rows", "x bytes", "y bytes"), keys=2))
    if view["classes"]:
        splits = tuple(view["splits"])
        rows = [(c["index"], c["name"], *(c[s] for s in splits), c["total"]) for c in view["classes"]]
        print_table(console, table("classes", ("#", "class", *splits, "total"), rows, right=("#", *splits, "total"),
                                   keys=2))
    if view["targets"]:
        rows = [(name, *(s[k] for k in STAT_COLUMNS)) for name, s in view["targets"].items()]
        print_table(console, table("targets", ("split", *STAT_COLUMNS), rows, right=STAT_COLUMNS))
    features = view["features"]
    rows = [(f["index"], f["name"] or "", f["mean"], f["std"], f["min"], f["max"]) for f in features["stats"]]
    print_table(console, table(f"features (statistics from the {features['source']})",
                               ("#", "name", "mean", "std", "min", "max"), rows,
                               right=("#", "mean", "std", "min", "max"), keys=2))
    if features["shown"] < features["count"]:
        console.print(Text(f"showing {features['shown']} of {features['count']} features; --all shows every one"))


def _history(entries: list[dict[str, Any]]) -> str | None:
    """``started T; resumed 2 times; train.epochs 15 -> 20 (T)``."""
    if not entries:
        return None
    resumes = [e for e in entries if e.get("event") == "resume"]
    parts = [f"started {entries[0].get('time')}"]
    if resumes:
        parts.append(f"resumed {len(resumes)} time{'s' * (len(resumes) > 1)}")
    parts += [f"{key} {change.get('from')} -> {change.get('to')} ({e.get('time')})" for e in resumes
              for key, change in (e.get("changes") or {}).items()]
    return "; ".join(parts)


def render_run(view: dict[str, Any], console: Console) -> None:
    job, progress = view["job"] or {}, view["progress"]
    train, model = job.get("train", {}), job.get("model", {})
    options = ", ".join(f"{k}={v}" for k, v in model.items() if k != "kind")
    one_pass = progress.get("one_pass")  # an additive model: no optimizer, epochs or updates to show
    lines(console, [
        ("run", view["path"]),
        ("model", f"{model.get('kind')}" + (f" ({options})" if options else "") if model else None),
        ("parameters", _parameters(view["params"])),
        ("data", job.get("data", {}).get("path")),
        ("optimizer", f"{train.get('optimizer')} lr {train.get('lr')} schedule {train.get('schedule')}"
         if train and not one_pass else None),
        ("training", f"{ONE_PASS if one_pass else _count(train.get('epochs'), 'epoch')}"
                     f"{'' if one_pass else ', batch ' + str(train.get('batch_size') or 'full')}, "
                     f"{_count(train.get('workers'), 'worker')}, seed {train.get('seed')}" if train else None),
        ("progress", f"done, newest version {num(progress['newest_version'])}" if one_pass else
                     f"{progress['epochs_done']}/{progress['epochs'] or '?'} epochs, "
                     f"{plural(progress['updates'], 'update')}, newest version {num(progress['newest_version'])}"),
        ("history", _history(view.get("history") or []))])
    for problem in view.get("record_problems") or []:
        lines(console, [("DAMAGED", problem)])
    shown = (("result", "last_epoch"),) if one_pass else (("last epoch", "last_epoch"), ("best epoch", "best_epoch"))
    for label, key in shown:
        if progress[key]:
            record = progress[key]
            lines(console, [(label, ("" if one_pass else f"{record.get('epoch')}: ") + "  ".join(
                f"{k} {num(record.get(k))}" for k in _metric_keys(record) if not one_pass or k != "loss"))])
    if view.get("schedule"):
        render_schedule(view["schedule"], console)
    # Two tables of the same rows, so that each fits an 80-column terminal: where the weights stand, then
    # their files. (One table of all eleven columns is 150 wide.)
    entries = view["entries"]
    rows = [("*" if e["newest_complete"] else "", e["name"], e["version"], e["update"], e["epoch"],
             metric(e["train_loss"]), metric(e["val_loss"]), metric(e["val_accuracy"])) for e in entries]
    print_table(console, table("checkpoints and weight versions",
                               ("", "name", "version", "update", "epoch", "train loss", "val loss", "val acc"),
                               rows, right=("version", "update", "epoch", "train loss", "val loss", "val acc"),
                               keys=2))
    console.print(Text("* newest complete checkpoint (what `memtrain train --resume` starts from). "
                       "train loss: the epoch mean for a version that ends an epoch, else its update's batch loss."))
    rows = [(e["name"], e["type"], e["written"] or "-", size(e["bytes"]),
             verified(e["verified"]) if e["complete"] else "INCOMPLETE") for e in entries]
    print_table(console, table("their files", ("name", "type", "written", "size", "verified"), rows,
                               right=("size",)))
    for e in entries:
        if not e["complete"]:
            lines(console, [(f"{e['name']} INCOMPLETE", e["problem"])])
    if not any(e["verified"] is not None for e in view["entries"]):
        console.print(Text("checksums not checked; --verify re-hashes every file"))


def render_schedule(schedule: dict[str, Any], console: Console) -> None:
    """The staleness histogram of a run's applied gradients (docs/async.md)."""
    if schedule["problem"]:
        lines(console, [("schedule", f"lineage unreadable: {schedule['problem']}")])
        return
    mode = {"sync": f"sync, staleness {schedule['staleness']}",
            "async": f"async, max_staleness {schedule['max_staleness']}, async_group {schedule['async_group']}"}
    widest = max(row["gradients"] for row in schedule["histogram"])
    rows = [(row["staleness"], row["gradients"], f"{row['share']:.1%}",
             "#" * max(1, round(30 * row["gradients"] / widest))) for row in schedule["histogram"]]
    print_table(console, table(f"gradient staleness ({mode.get(schedule['mode'], schedule['mode'])}): mean "
                               f"{schedule['mean']:.2f}, max {schedule['max']}, {schedule['discarded']:,} stale "
                               "gradients recomputed", ("staleness", "gradients", "share", ""), rows,
                               right=("staleness", "gradients", "share")))
    console.print(Text("staleness: how many versions older than the one it was applied to were the weights a "
                       "gradient was computed at. --lineage VERSION shows one version's sources."))


def render_lineage(view: dict[str, Any], console: Console) -> None:
    lines(console, [("run", view["path"]),
                    ("version", f"{view['version']} ({'on disk' if view['on_disk'] else 'retired: not on disk'})"),
                    ("origin", view["origin"] if view["parent"] is None else
                     f"update {view['update']} (epoch {view['epoch']}) applied to version {view['parent']}, "
                     f"lr {num(view['lr'])}"),
                    ("gradients from versions", ", ".join(map(str, view["sources"])) or None),
                    ("recorded checksum", view["checksum"]),
                    ("used by", ", ".join(map(str, view["used_by"])) or "no later version")])
    if view["gradients"]:
        rows = [(g["order"], f"{g['rows'][0]}-{g['rows'][1]}", g["at"], g["staleness"]) for g in view["gradients"]]
        where = "positions in the epoch's row order" if view.get("shuffled") else "train rows"
        print_table(console, table("gradients, in the order they were added",
                                   ("#", where, "computed at version", "staleness"), rows,
                                   right=("#", "computed at version", "staleness")))


def _parameters(params: dict[str, Any] | None) -> str | None:
    return f"{num(params['count'])} in {plural(params['tensors'], 'array')}" if params else None


def render_tensors(view: dict[str, Any], console: Console) -> None:
    kind = view["kind"]
    named = f"named by {view['named_by']}" if view["named_by"] else "one array (no layout describes this file)"
    lines(console, [(kind, view["path"]), ("file", f"{view['file']} ({size(view['bytes'])}), {named}"),
                    ("run", view["run"])])
    if kind == "checkpoint":
        lines(console, [("position", f"update {num(view['update'])}, epoch {num(view['epoch'])}, "
                                     f"weights version {num(view['weights_version'])}"),
                        ("created", view["created"]), ("model", view["model"] and view["model"].get("kind"))])
    if kind in ("weights", "gradient"):
        lines(console, [("version", view["version"]), ("task", view.get("task")), ("attempt", view.get("attempt")),
                        ("recorded checksum", view.get("checksum"))])
    if view.get("metrics"):
        record = view["metrics"]
        lines(console, [(f"metrics ({record.get('kind')} record)", "  ".join(
            f"{k} {num(record.get(k))}" for k in _metric_keys(record)))])
    columns = ("name", "shape", "dtype", *STAT_COLUMNS)
    rows = [(p["name"], str(tuple(p["shape"])), p["dtype"], *(p[k] for k in STAT_COLUMNS)) for p in view["params"]]
    total = view["total"]
    rows.append(("(all)", f"{total['size']:,} values", "", *(total[k] for k in STAT_COLUMNS)))
    print_table(console, table("parameters (min/max/mean/std/l2 over finite values)", columns, rows,
                               right=STAT_COLUMNS))
    if kind == "checkpoint":
        render_checkpoint_extras(view, console)
    elif "verified" in view:
        lines(console, [("checksum", verified(view["verified"]))])


def render_checkpoint_extras(view: dict[str, Any], console: Console) -> None:
    optimizer = view["optimizer"]
    rows = [(s["slot"], s["file"], s["size"], *(s[k] for k in STAT_COLUMNS)) for s in optimizer.get("state", [])]
    title = f"optimizer state: {optimizer.get('name')}, step {num(optimizer.get('step'))}"
    if rows:
        print_table(console, table(title, ("slot", "file", "values", *STAT_COLUMNS), rows,
                                   right=("values", *STAT_COLUMNS)))
    else:
        console.print(Text(title + " (no state arrays)"))
    files = [(f["name"], size(f["bytes"]), f["checksum"], verified(f["verified"])) for f in view["files"]]
    print_table(console, table("files", ("name", "size", "recorded checksum", "verified"), files, right=("size",)))


def render_diff(view: dict[str, Any], console: Console) -> None:
    lines(console, [("base", view["path"]), ("other", view["other"])])
    columns = ("name", "shape", "l2 distance", "max abs diff", "relative change", "norm", "other norm")
    keys = ("l2_distance", "max_abs_diff", "relative_change", "norm", "other_norm")
    rows = [(p["name"], str(tuple(p["shape"])), *(p[k] for k in keys)) for p in view["params"]]
    rows.append(("(all)", "", *(view["total"][k] for k in keys)))
    print_table(console, table("differences (other - base; relative to ||base||)", columns, rows, right=columns[2:]))


def _count(value: Any, noun: str) -> str:
    """A count from a saved job (which may lack it) with its noun."""
    return plural(value, noun) if isinstance(value, int) else f"{value} {noun}s"


def _metric_keys(record: dict[str, Any]) -> list[str]:
    """The training loss and every validation metric of an epoch record, val_loss first."""
    return [k for k in ("loss", "val_loss") if k in record] + sorted(
        k for k in record if k.startswith("val_") and k != "val_loss")


def render_written(view: dict[str, Any], console: Console) -> None:
    if view["kind"] == "export":
        detail = (f"{plural(len(view['arrays']), 'array')}, {view['format']}, {size(view['bytes'])}; "
                  f"normalization: {view.get('normalization', 'unknown')}"
                  + ("; table encoding: written" if view.get("encoding") == "written" else ""))
    elif "versions" in view:  # a reinforcement-learning run's
        detail = plural(view["versions"], "version")
    else:
        detail = f"{plural(view['epochs'], 'epoch')}, {plural(view['updates'], 'update')}"
    console.print(Text(f"wrote {view['out']} ({detail}) from {view['path']}"))


def render_verify(result: dict[str, Any], console: Console) -> None:
    if result["ok"]:
        console.print(Text(f"verify: {plural(result['checked'], 'file')} re-hashed, every checksum matches"))
    else:
        console.print(Text(f"verify: {len(result['failures'])} of {plural(result['checked'], 'file')} FAILED",
                           style="bold red"))
    if result["unrecorded"]:
        console.print(Text(f"verify: no checksum recorded for {plural(len(result['unrecorded']), 'file')}; "
                           "their headers and sizes are valid"))
