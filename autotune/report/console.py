"""The terminal: one console for results (stdout) and one for diagnostics (stderr), and tables
whose cells wrap instead of being cut short."""

from __future__ import annotations

import math
import os
from typing import Any

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

__all__ = ["console", "cut", "err_console", "metric_cell", "print_table", "table"]

# Lines are never folded at the terminal width: logs of overnight runs get grepped (tables still fit it).
console = Console(soft_wrap=True)
err_console = Console(stderr=True, soft_wrap=True)


def table(columns: list[tuple[str, dict[str, Any]]], **options: Any) -> Table:
    """A table whose cells wrap (folding long words) instead of being cut short with "…": a
    flag, a value or a reason is read whole or not at all."""
    grid = Table(**options)
    for header, column in columns:
        grid.add_column(header, overflow="fold", **column)
    return grid


def print_table(table: Table) -> None:
    """On a terminal, or wherever ``COLUMNS`` gives a width, the table fits it (cells wrap); in a
    log or a pipe it takes the width it needs, so no cell is folded there either."""
    if console.is_terminal or os.environ.get("COLUMNS", "").isdigit():
        console.print(table)
    else:
        wide = Measurement.get(console, console.options.update_width(10_000), table).maximum
        narrow = console.width
        console.width = max(narrow, wide)
        try:
            console.print(table)
        finally:
            console.width = narrow


def metric_cell(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return format(value, spec)


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters, cut at a word with "…" (never mid-word)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    space = head.rfind(" ")
    return (head[:space] if space > limit // 2 else head).rstrip(" ,;:—-") + "…"
