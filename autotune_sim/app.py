"""Entry point: ``python -m autotune_sim vllm|sglang [the engine's own flags]``.

The first argument picks the dialect; everything after it is the real engine's argv. Simulator
settings come only from ``AUTOTUNE_SIM_*`` environment variables (see ``settings.py``), so a
launch line differs from the real engine's only in its command prefix.
"""

from __future__ import annotations

import sys

from autotune_sim.settings import SettingsError, load_settings

__all__ = ["main"]

USAGE = "usage: python -m autotune_sim {vllm,sglang} [engine flags ...]"


def main(argv: list[str] | None = None) -> int:
    """Run one simulated engine process; return its exit code."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("vllm", "sglang"):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        settings = load_settings()
    except SettingsError as err:
        print(f"autotune simulator: {err}", file=sys.stderr)
        return 2
    if args[0] == "vllm":
        from autotune_sim.dialects.vllm import VllmDialect

        return VllmDialect(settings).main(args[1:])
    from autotune_sim.dialects.sglang import SglangDialect

    return SglangDialect(settings).main(args[1:])
