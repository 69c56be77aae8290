"""How the command line's help reads: typer prints a value type (``<bool>``) beside on/off flags,
which reads as if the flag took a value (``--debug true``); flags take none, so their type
column stays empty. Applied once, when the command line is imported."""

from __future__ import annotations

from typing import Any

__all__ = ["flags_show_no_value_type"]


def flags_show_no_value_type() -> None:
    """Leave the value-type column of on/off flags empty in typer's help."""
    from typer.core import TyperOption

    original = getattr(TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "_autotune_flags", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        if getattr(self, "is_flag", False):
            return None
        result: str | None = original(self, ctx)
        return result

    display_type_rich._autotune_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]
