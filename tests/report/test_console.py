"""Terminal text: a reason shortened at a word, a table that fits the width the user gives."""

from __future__ import annotations

import pytest
from rich.console import Console

from autotune.report import console as console_module
from autotune.report.console import cut, print_table, table

REASON = "RuntimeError: Including non-PyTorch memory, this process has 79.10 GiB memory in use"


def test_a_long_reason_is_cut_at_a_word() -> None:
    assert cut(REASON, 40) == "RuntimeError: Including non-PyTorch…"
    assert cut(REASON, 200) == REASON
    assert cut("a  b\n c", 10) == "a b c"  # whitespace as one space, as on one line
    assert cut("x" * 50, 10) == "x" * 9 + "…"  # one long word: cut inside it, the only way


@pytest.mark.parametrize(("columns", "widest"), [("120", 120), (None, 400)])
def test_a_table_in_a_pipe_fits_columns_when_given(
    columns: str | None, widest: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    pipe = Console(force_terminal=False, width=120, soft_wrap=True, color_system=None)
    monkeypatch.setattr(console_module, "console", pipe)
    grid = table([("flags / reason", {})])
    grid.add_row(" ".join(["max_num_seqs=256"] * 20))
    with pipe.capture() as captured:
        print_table(grid)
    lines = captured.get().splitlines()
    assert max(map(len, lines)) <= widest
    assert (max(map(len, lines)) > 120) is (columns is None)  # without COLUMNS a pipe keeps each row whole
