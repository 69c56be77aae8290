"""Engine dialects: one adapter per serving engine, looked up by ``EngineSettings.kind``.

The contract every adapter follows is in :mod:`autotune.engines.base`.
"""

from __future__ import annotations

from autotune.config import EngineSettings
from autotune.engines.base import EngineAdapter
from autotune.engines.sglang import SglangAdapter
from autotune.engines.vllm import VllmAdapter
from autotune.errors import ConfigError

__all__ = ["ADAPTERS", "EngineAdapter", "SglangAdapter", "VllmAdapter", "engines_named", "get_adapter"]

#: engine kind → adapter class. A new dialect registers here under its ``kind``.
ADAPTERS: dict[str, type[EngineAdapter]] = {
    "vllm": VllmAdapter,
    "sglang": SglangAdapter,
}


def get_adapter(settings: EngineSettings) -> EngineAdapter:
    """The adapter for ``settings.kind``.

    Raises:
        ConfigError: When no adapter is registered under that kind (the valid kinds are listed).
    """
    try:
        adapter_cls = ADAPTERS[settings.kind]
    except KeyError:
        raise ConfigError(
            f"engine.kind {settings.kind!r} is not supported; use one of: {', '.join(sorted(ADAPTERS))}"
        ) from None
    return adapter_cls(settings)


def engines_named(words: list[str]) -> set[str]:
    """Engines a launch command names: its program (``vllm serve``) or its module (``-m sglang...``)."""
    found = set()
    for i, word in enumerate(words):
        name = word.rsplit("/", 1)[-1]
        if name in ADAPTERS:
            found.add(name)
        if i and words[i - 1] == "-m" and word.split(".")[0] in ADAPTERS:
            found.add(word.split(".")[0])
    return found
