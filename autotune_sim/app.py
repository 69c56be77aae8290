"""Entry point: ``python -m autotune_sim vllm|sglang|sglang-weight-cache [the engine's own flags]``.

The first argument picks the dialect; everything after it is the real engine's argv
(``vllm preload ...`` is ``vllm preload``, the weight-cache daemon of vLLM 0.34, and
``sglang-weight-cache ...`` is ``python -m sglang.srt.weight_cache.daemon ...``). Simulator
settings come only from ``AUTOTUNE_SIM_*`` environment variables (see ``settings.py``), so a
launch line differs from the real engine's only in its command prefix.

``python -m autotune_sim error-bands`` prints the simulator's validated error per kind of number
as JSON (``fidelity.error_band``) and exits; it starts no engine. ``python -m autotune_sim twin``
reads a study's runs and a candidate as JSON on standard input and prints the fitted step model's
prediction for it (``twin.answer``); it starts no engine either.
"""

from __future__ import annotations

import sys

from autotune_sim.settings import SettingsError, load_settings

__all__ = ["main"]

USAGE = "usage: python -m autotune_sim {vllm,sglang,sglang-weight-cache} [engine flags ...] | error-bands | twin"
DIALECTS = ("vllm", "sglang", "sglang-weight-cache")


def main(argv: list[str] | None = None) -> int:
    """Run one simulated engine process; return its exit code."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["error-bands"]:
        from autotune_sim.fidelity import bands_json

        print(bands_json())
        return 0
    if args == ["twin"]:
        return _twin()
    if not args or args[0] not in DIALECTS:
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
    if args[0] == "sglang-weight-cache":
        from autotune_sim.dialects.base import LogWriter
        from autotune_sim.dialects.sglang_weight_cache import run_daemon

        return run_daemon(settings, LogWriter(sys.stdout, sys.stderr), args[1:])
    from autotune_sim.dialects.sglang import SglangDialect

    return SglangDialect(settings).main(args[1:])


def _twin() -> int:
    """``twin``: one JSON request on standard input, one JSON answer on standard output."""
    import json

    from autotune_sim.twin import TwinInputError, answer

    try:
        print(json.dumps(answer(json.loads(sys.stdin.read()))))
    except json.JSONDecodeError as err:
        print(f"autotune simulator twin: standard input is not JSON ({err})", file=sys.stderr)
        return 2
    except TwinInputError as err:
        print(f"autotune simulator twin: {err}", file=sys.stderr)
        return 2
    return 0
