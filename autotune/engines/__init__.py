"""Engine dialects: one adapter per serving engine, looked up by ``EngineSettings.kind``.

The contract every adapter follows is in :mod:`autotune.engines.base`.
"""

from __future__ import annotations

from autotune.config import EngineSettings
from autotune.engines.base import EngineAdapter
from autotune.engines.sglang import SglangAdapter
from autotune.engines.vllm import VllmAdapter
from autotune.errors import ConfigError

__all__ = ["ADAPTERS", "EngineAdapter", "SglangAdapter", "VllmAdapter", "get_adapter"]

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
