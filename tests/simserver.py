"""A simulated vLLM server on a free port, for tests that drive the CLI against a URL."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def running_simulator(*flags: str, speedup: int = 50, env: dict[str, str] | None = None) -> Iterator[str]:
    """``python -m autotune_sim vllm`` with ``flags`` (and ``AUTOTUNE_SIM_*`` settings in ``env``);
    yields its base URL once /health is 200, and kills its process group on the way out."""
    port = _free_port()
    argv = [sys.executable, "-m", "autotune_sim", "vllm", "--model", "meta-llama/Llama-3.1-8B-Instruct", *flags]
    proc = subprocess.Popen(
        [*argv, "--port", str(port)],
        env={**os.environ, **(env or {}), "AUTOTUNE_SIM_SPEEDUP": str(speedup)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            assert proc.poll() is None, "the simulator exited"
            time.sleep(0.1)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
