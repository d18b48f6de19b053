"""A CSV file with a header row -> chunks of (x, y) rows, each row knowing its line for error messages.

Parser, chosen by measurement (docs/prepare.md): ``np.loadtxt``'s C parser on blocks of whole
records, about 3x the standard ``csv`` module and with no optional dependency. The file is cut into
blocks only at newlines outside quotes, so quoted fields may hold commas and newlines. When a block fails
to parse, the ``csv`` module re-reads that block alone to name the exact line and column. Policy: UTF-8
(a BOM is skipped), LF or CRLF, blank lines skipped, ragged rows and empty fields are errors (never
padded), surrounding spaces in text labels are ignored.
"""

from __future__ import annotations

import csv
import io
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from memtrain.errors import InputError
from memtrain.prepare.sources import Chunk, resolve_label

QUOTE = ord('"')
NEWLINE = ord("\n")
MIN_BLOCK = 1 << 16
# A parsed value is 8 bytes (float64) and the shortest text for one is 2 bytes ("0,"), so a block of B
# text bytes parses into at most 4B bytes: a quarter of the chunk budget keeps the parsed block within it.
TEXT_SHARE = 4


def record_end(data: bytes, *, last: bool) -> int:
    """Index just past the last (or first) newline of ``data`` that is outside quotes; -1 if none."""
    if QUOTE not in data:
        pos = data.rfind(b"\n") if last else data.find(b"\n")
        return pos + 1 if pos >= 0 else -1
    raw = np.frombuffer(data, dtype=np.uint8)
    quotes = np.flatnonzero(raw == QUOTE)
    newlines = np.flatnonzero(raw == NEWLINE)
    outside = newlines[np.searchsorted(quotes, newlines) % 2 == 0]
    if len(outside) == 0:
        return -1
    return int(outside[-1 if last else 0]) + 1


class CsvSource:
    format = "csv"

    def __init__(self, path: Path, label: str | None, chunk_bytes: int):
        self.path = path
        self.size_bytes = path.stat().st_size
        self.block_bytes = max(MIN_BLOCK, chunk_bytes // TEXT_SHARE)
        header, self.data_offset = self._header_bytes()
        self.first_line = header.count(b"\n") + 1
        self.columns = self._header_names(header)
        self.label_index = resolve_label(self.columns, label, path)
        self.label_name = self.columns[self.label_index]
        self.feature_names = [c for i, c in enumerate(self.columns) if i != self.label_index]
        if not self.feature_names:
            raise InputError("no feature columns", path=path, where="line 1", expected="at least one column "
                             "besides the label", found=f"only '{self.label_name}'")
        self.feature_shape = (len(self.feature_names),)
        self.rows = None
        self.text_labels = self._sniff_text_labels()

    def _header_bytes(self) -> tuple[bytes, int]:
        data = b""
        with open(self.path, "rb") as handle:
            while block := handle.read(MIN_BLOCK):
                data += block
                end = record_end(data, last=False)
                if end >= 0:
                    return data[:end], end
        return data, len(data)

    def _header_names(self, header: bytes) -> list[str]:
        text = _decode(header, self.path, 1).removeprefix("\ufeff")
        if not text.strip():
            raise InputError("the file is empty", path=self.path, expected="a header row and data rows",
                             found="no header")
        names = next(csv.reader(io.StringIO(text, newline="")))
        return [name.strip() for name in names]

    def _sniff_text_labels(self) -> bool:
        """Labels are text if the first data row's label is not a number (fixed for the whole file)."""
        with open(self.path, "rb") as handle:
            handle.seek(self.data_offset)
            sample = handle.read(MIN_BLOCK)
        text = sample.decode("utf-8", errors="replace")
        for record in csv.reader(io.StringIO(text, newline="")):
            if record and len(record) == len(self.columns):
                try:
                    float(record[self.label_index])
                except ValueError:
                    return True
                return False
        return False

    def chunks(self, rows: int) -> Iterator[Chunk]:
        """Blocks of about ``block_bytes`` of text, cut after whole records (``rows`` is ignored)."""
        line, first_row, carry = self.first_line, 0, b""
        with open(self.path, "rb") as handle:
            handle.seek(self.data_offset)
            while True:
                block = handle.read(self.block_bytes)
                data = carry + block
                if block:
                    end = record_end(data, last=True)
                    if end < 0:
                        carry = data
                        continue
                    data, carry = data[:end], data[end:]
                if data:
                    chunk = self._parse(data, line, first_row)
                    line += data.count(b"\n")
                    if chunk is not None:
                        first_row += len(chunk.x)
                        yield chunk
                if not block:
                    return

    def _parse(self, data: bytes, line: int, first_row: int) -> Chunk | None:
        text = _decode(data, self.path, line)
        if not text.strip():
            return None
        names: dict[str, int] = {}
        converters = {self.label_index: lambda s: names.setdefault(s.strip(), len(names))} \
            if self.text_labels else None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # loadtxt warns on blocks of blank lines
                table = np.loadtxt(_lines(text), delimiter=",", quotechar='"', comments=None,
                                   dtype=np.float64, ndmin=2, converters=converters)
        except ValueError as exc:
            raise self._diagnose(text, line, exc) from exc
        if table.shape[1] != len(self.columns):
            raise self._diagnose(text, line, ValueError(f"{table.shape[1]} columns"))
        x, y = self._split_columns(table)
        if self.text_labels:
            y = np.array(list(names), dtype=str)[y.astype(np.int64)]
        return Chunk(x, y, first_row, len(data), line_of=lambda i: record_line(text, line, i))

    def _split_columns(self, table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        k = self.label_index
        if k == table.shape[1] - 1:
            return table[:, :k], table[:, k]
        if k == 0:
            return table[:, 1:], table[:, 0]
        return np.delete(table, k, axis=1), table[:, k]

    def _diagnose(self, text: str, line: int, exc: Exception) -> InputError:
        """Re-read a block that failed to parse with the csv module: the first bad line and column."""
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        end = 0
        try:
            for record in reader:
                start, end = line + end, reader.line_num
                if record:
                    problem = self._check_record(record, start)
                    if problem is not None:
                        return problem
        except csv.Error as error:
            return InputError(f"malformed CSV ({error})", path=self.path, where=f"line {line + reader.line_num - 1}")
        return InputError(f"cannot parse the CSV ({exc})", path=self.path, where=f"lines {line}-{line + end - 1}")

    def _check_record(self, record: list[str], line: int) -> InputError | None:
        if len(record) != len(self.columns):
            return InputError("ragged row: wrong number of fields", path=self.path, where=f"line {line}",
                              expected=f"{len(self.columns)} fields as in the header", found=f"{len(record)} fields",
                              hint="memtrain never pads or truncates rows")
        for index, value in enumerate(record):
            if index == self.label_index and self.text_labels:
                continue
            try:
                float(value)
            except ValueError:
                return self._not_a_number(index, value, line)
        return None

    def _not_a_number(self, index: int, value: str, line: int) -> InputError:
        column = self.columns[index]
        where = f"line {line}, column '{column}'"
        found = "an empty field" if not value.strip() else repr(value)
        if index == self.label_index:
            return InputError("the label is not a number", path=self.path, where=where, expected="a number "
                              "(the first rows have numeric labels)", found=found)
        return InputError("not a number in a feature column", path=self.path, where=where, expected="a number",
                          found=found)

    def describe(self) -> dict[str, Any]:
        return {"format": "csv", "path": str(self.path), "label": self.label_name, "bytes": self.size_bytes}


def record_line(text: str, first_line: int, row: int) -> int:
    """The line on which data row ``row`` (0-based, blank lines not counted) of a block starts."""
    reader = csv.reader(io.StringIO(text, newline=""))
    end, seen = 0, 0
    for record in reader:
        start, end = first_line + end, reader.line_num
        if record:
            if seen == row:
                return start
            seen += 1
    return first_line + end


def _lines(text: str) -> list[str] | io.StringIO:
    """A list of lines parses faster and in less memory than a StringIO (measured: 60 vs 41 MB/s, and no
    UCS-4 copy of the block); with quotes present a field may span lines, so the stream is used."""
    return io.StringIO(text, newline=None) if '"' in text else text.split("\n")


def _decode(data: bytes, path: Path, line: int) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad_line = line + data[:exc.start].count(b"\n")
        raise InputError("the file is not UTF-8 text", path=path, where=f"line {bad_line}",
                         found=repr(data[exc.start:exc.start + 8])) from exc
