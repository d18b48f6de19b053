"""A finished ``table.Survey`` -> what prepare says before it writes a row: text columns that are probably no
categories (identifiers, dates), the levels that went to ``<rare>``, and the size the encoding will write
when it is far larger than the source. Said, not refused: each is sometimes what the user wants.
"""

from __future__ import annotations

import re
import shlex

from memtrain.errors import plural
from memtrain.prepare.table import CATEGORY, Encoding, Survey, TableOptions

# A text column with more distinct values than this share of its (non-missing) cells names rows rather than
# a property of them: penguins' "Individual ID" has 190 in 344 rows, flights' tailnum 4,043 in 336,776
# (but 4,043 is more than a one-hot encoding should hold). Below MIN_IDENTIFIER_LEVELS a small table's
# column is not judged.
IDENTIFIER_SHARE = 0.5
MIN_IDENTIFIER_LEVELS = 20
# Levels checked for looking like dates (the first ones seen; a date column is dates throughout), and the
# share of them that must be dates or times: 2007-11-11, 2013-01-01 05:00:00, 2013-01-01T05:00Z, 11/11/2007.
DATE_SAMPLE = 200
DATE_SHARE = 0.9
DATE = re.compile(r"\d{4}-\d{1,2}-\d{1,2}([ T]\d{1,2}:\d{2}(:\d{2}(\.\d+)?)?)?( ?(Z|[+-]\d{2}:?\d{2}|[A-Z]{3}))?"
                  r"|\d{1,2}/\d{1,2}/\d{2,4}( \d{1,2}:\d{2}(:\d{2})?)?")
# The encoded rows are worth a warning when they take this many times the source's bytes, and at least
# ENCODED_WARN_BYTES: a 1.3 MB CSV with a 60,000-level column wrote 28.8 GB of one-hot shards.
ENCODED_WARN_RATIO = 10
ENCODED_WARN_BYTES = 256 << 20


def distinct_levels(survey: Survey) -> dict[str, int]:
    """Per text column, the distinct values seen in cells that are not missing (before ``--max-levels``)."""
    return {name: sum(1 for level, i in survey.ids[j].items() if survey.counts[j][i] > 0)
            for j, name in enumerate(survey.names) if survey.kinds[j] == CATEGORY}


def column_notes(survey: Survey, rows: int) -> list[str]:
    """Warnings for text columns that look like identifiers or dates, each with the option that leaves it out."""
    notes = []
    distinct = distinct_levels(survey)
    for j, name in enumerate(survey.names):
        if survey.kinds[j] != CATEGORY:
            continue
        levels = distinct[name]
        values = rows - int(survey.missing[j])
        drop = f"leave it out with --drop-columns {shlex.quote(name)}"
        sample = [level for level in list(survey.ids[j])[:DATE_SAMPLE] if level]
        if sample and sum(bool(DATE.fullmatch(level)) for level in sample) >= DATE_SHARE * len(sample):
            notes.append(f"column '{name}' looks like dates or times ({plural(levels, 'distinct value')}, e.g. "
                         f"'{sample[0]}'): as text, each date is a level of its own; {drop}, or turn it into "
                         "numbers (a day of the year, an hour) before prepare")
        elif levels >= MIN_IDENTIFIER_LEVELS and levels > IDENTIFIER_SHARE * values:
            notes.append(f"column '{name}' looks like an identifier ({plural(levels, 'distinct value')} in "
                         f"{plural(values, 'row')}): its levels name rows, not something a model can learn from; "
                         f"{drop}")
    return notes


def levels_line(encoding: Encoding, distinct: dict[str, int]) -> list[str]:
    """``dest: 100 levels, 5 more in <rare> (one-hot)`` per text column (the summary's ``text`` line)."""
    lines = []
    for column in encoding.columns:
        if column.kind != CATEGORY:
            continue
        rare = distinct.get(column.name, len(column.levels)) - len(column.levels)
        more = f", {rare:,} more in <rare>" if rare > 0 else ""
        lines.append(f"{column.name}: {plural(len(column.levels), 'level')}{more} ({encoding.categorical})")
    return lines


def rare_note(encoding: Encoding, distinct: dict[str, int], options: TableOptions) -> str | None:
    """A warning naming the text columns whose levels did not all fit in ``--max-levels``."""
    cut = [(c.name, distinct[c.name] - len(c.levels)) for c in encoding.columns
           if c.kind == CATEGORY and distinct.get(c.name, 0) > len(c.levels)]
    if not cut:
        return None
    rule = f"the {options.max_levels:,} most frequent (--max-levels)" + (
        f", each seen at least {options.min_level_count:,} times (--min-level-count)"
        if options.min_level_count > 1 else "")
    return ("levels went to <rare>: " + ", ".join(f"{name} {plural(n, 'level')}" for name, n in cut)
            + f" (a text column keeps {rule}; the others share one feature, <rare>)")


def size_note(encoding: Encoding, rows: int, itemsize: int, source_bytes: int) -> str | None:
    """A warning when the encoded rows are far larger than the source, naming the widest columns."""
    encoded = rows * encoding.width * itemsize
    if encoded < ENCODED_WARN_BYTES or encoded < ENCODED_WARN_RATIO * source_bytes:
        return None
    widths = sorted(((len(c.buckets) if encoding.categorical == "one-hot" else 1, c.name)
                     for c in encoding.columns if c.kind == CATEGORY), reverse=True)[:3]
    widest = ", ".join(f"{name} {plural(width, 'feature')}" for width, name in widths)
    names = ",".join(name for _, name in widths)
    return (f"the encoded rows will take about {_size(encoded)}, {encoded / max(1, source_bytes):,.0f} times the "
            f"{_size(source_bytes)} source ({plural(encoding.width, 'feature')} a row; widest: {widest}): "
            f"--drop-columns {shlex.quote(names)}, a lower --max-levels or --categorical-encoding ordinal makes "
            "it smaller")


def _size(count: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f} {unit}"
    return f"{count} bytes"
