"""A bench's table at two terminal widths, for tests/test_bench*.py: it fits 80 columns, and a wide terminal
shows it as one table (issue 44)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

Printer = Callable[[dict[str, Any]], None]


def printed(print_table: Printer, report: dict, columns: int, capsys: pytest.CaptureFixture[str],
            monkeypatch: pytest.MonkeyPatch) -> str:
    """A bench's table as a terminal of ``columns`` columns shows it."""
    monkeypatch.setenv("COLUMNS", str(columns))
    print_table(report)
    return capsys.readouterr().out


def assert_fits_or_whole(print_table: Printer, report: dict, headers: tuple[str, ...],
                         capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """At 80 columns every line fits and every header is whole; at 250 the table is one table, as before."""
    narrow = printed(print_table, report, 80, capsys, monkeypatch)
    assert max(map(len, narrow.splitlines())) <= 80, narrow
    cells = {cell.strip() for line in narrow.splitlines() for cell in line.split("┃")}
    assert set(headers) <= cells, set(headers) - cells
    wide = printed(print_table, report, 250, capsys, monkeypatch)
    header = next(line for line in wide.splitlines() if "┃" in line)
    assert [cell.strip() for cell in header.split("┃")] == list(headers), header
