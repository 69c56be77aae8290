"""Fixtures for the simulator's tests: a real server subprocess on a free loopback port.

Every process runs in its own session and its process group is SIGKILLed in ``finally``; its
combined output is collected by a reader thread so tests can look for exact log lines.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from autotune_sim.dialects.sglang_args import RELEASES

READY_TIMEOUT_S = 60.0
# The simulated vLLM keeps a torch.compile cache under VLLM_CACHE_ROOT (default ~/.cache/vllm):
# the tests' engines use one of their own, so a user's cache never makes a test start warm.
COMPILE_CACHE = tempfile.mkdtemp(prefix="autotune-sim-vllm-cache-")
atexit.register(shutil.rmtree, COMPILE_CACHE, ignore_errors=True)
FAST = {
    "AUTOTUNE_SIM_SPEEDUP": "500",
    "AUTOTUNE_SIM_GPU": "H100-80GB",
    "AUTOTUNE_SIM_SEED": "0",
    "VLLM_CACHE_ROOT": COMPILE_CACHE,
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class SimProcess:
    """A running simulator and what it printed so far."""

    proc: subprocess.Popen[str]
    port: int
    lines: list[str] = field(default_factory=list)
    reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append(raw.rstrip("\n"))

    def wait_ready(self, path: str = "/health") -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    pytest.fail(f"simulator exited ({self.proc.returncode}): {self.lines[-8:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(self.url + path).status_code == 200:
                        return
                time.sleep(0.05)
        pytest.fail(f"simulator not ready on {path}: {self.lines[-8:]}")

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        code = self.proc.wait(timeout=timeout_s)
        if self.reader is not None:  # the last lines may still be in the pipe: read them all first
            self.reader.join(timeout=timeout_s)
        return code

    def wait_line(self, needle: str, timeout_s: float = 30.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if needle in line:
                    return line
            time.sleep(0.05)
        pytest.fail(f"no line with {needle!r}: {self.lines[-8:]}")

    def text(self) -> str:
        return "\n".join(self.lines)


def start(dialect: str, *flags: str, env: dict[str, str] | None = None, port: int | None = None) -> SimProcess:
    """Start ``python -m autotune_sim <dialect> <flags> --port P`` with fast modelled time."""
    if "--port" in flags:
        port = int(flags[flags.index("--port") + 1])
    port = port or free_port()
    argv = [sys.executable, "-m", "autotune_sim", dialect, *flags]
    if "--port" not in flags:
        argv += ["--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **FAST, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    sim = SimProcess(proc, port)
    sim.reader = threading.Thread(target=sim.read, daemon=True)
    sim.reader.start()
    return sim


def stop(sim: SimProcess) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sim.proc.pid, signal.SIGKILL)
    sim.proc.wait(timeout=30)


class Sims:
    """Starts simulators for one test and kills every one of them (process group) at teardown."""

    def __init__(self) -> None:
        self.started: list[SimProcess] = []

    def start(self, dialect: str, *flags: str, env: dict[str, str] | None = None) -> SimProcess:
        sim = start(dialect, *flags, env=env)
        self.started.append(sim)
        return sim

    def ready(self, dialect: str, *flags: str, env: dict[str, str] | None = None) -> SimProcess:
        """A simulator that answers on its readiness path (vLLM /health, SGLang /ready where served)."""
        sim = self.start(dialect, *flags, env=env)
        version = (env or {}).get("AUTOTUNE_SIM_SGLANG_VERSION", "0.5.23")
        sim.wait_ready("/ready" if dialect == "sglang" and RELEASES[version].ready_route else "/health")
        return sim

    def exited(
        self, dialect: str, *flags: str, env: dict[str, str] | None = None, timeout_s: float = 60.0
    ) -> SimProcess:
        """Run a simulator expected to exit by itself; its output is complete when this returns."""
        sim = self.start(dialect, *flags, env=env)
        sim.wait_exit(timeout_s)
        time.sleep(0.1)  # let the reader drain the pipe
        return sim

    def close(self) -> None:
        for sim in self.started:
            stop(sim)


@pytest.fixture
def sims() -> Iterator[Sims]:
    factory = Sims()
    try:
        yield factory
    finally:
        factory.close()
