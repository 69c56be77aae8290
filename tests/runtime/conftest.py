"""Helpers for runtime tests: argv for the fake engine, and engines that are always stopped."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


def fake_argv(*options: str) -> list[str]:
    return [sys.executable, str(FAKE_ENGINE), *options]


@pytest.fixture
def make_engine(tmp_path: Path) -> Iterator[Callable[..., EngineProcess]]:
    """Build EngineProcess objects for the fake engine on a free port; all are stopped at the end."""
    made: list[EngineProcess] = []

    def make(*options: str, serve: bool = False, **kwargs: Any) -> EngineProcess:
        """``serve=True`` makes the fake listen on the port that ready_url/health_url point to."""
        port = free_port()
        if serve:
            options = (*options, "--port", str(port))
        kwargs.setdefault("ready_url", f"http://127.0.0.1:{port}/health")
        kwargs.setdefault("startup_timeout_s", 30.0)
        kwargs.setdefault("grace_s", 2.0)
        engine = EngineProcess(fake_argv(*options), {}, tmp_path / f"engine{len(made)}.log", **kwargs)
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.stop()
