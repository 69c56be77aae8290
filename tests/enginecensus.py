"""A real engine's processes and serving state, seen from outside: for tests that act on them."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from autotune.bench import prometheus
from autotune.runtime.procfs import alive, environ_value, pids_in_group, read_cmdline


class Census:
    """Every live process of the engines whose environment carries ``AUTOTUNE_TEST_MARK=marker``.

    vLLM's ``VLLM::EngineCore`` and ``VLLM::Worker`` rename themselves with setproctitle, which
    overwrites their environment in ``/proc``: they are found through the process groups of the
    marked processes instead, which are remembered, so an EngineCore orphaned by its dead API
    server is still counted.
    """

    def __init__(self, marker: str) -> None:
        self.marker = marker
        self.pgids: set[int] = set()

    def pids(self) -> list[int]:
        marked = [
            int(e.name)
            for e in Path("/proc").glob("[0-9]*")
            if environ_value(int(e.name), "AUTOTUNE_TEST_MARK") == self.marker and alive(int(e.name))
        ]
        for pid in marked:
            with contextlib.suppress(ProcessLookupError):
                self.pgids.add(os.getpgid(pid))
        return sorted({*marked, *(pid for pgid in self.pgids for pid in pids_in_group(pgid))})

    def describe(self) -> dict[int, str]:
        return {pid: read_cmdline(pid) for pid in self.pids()}


def serving(trial_dir: Path) -> bool:
    """True once the trial's vLLM engine runs benchmark requests (several at once)."""
    try:
        argv = json.loads((trial_dir / "argv.json").read_text())["argv"]
        samples = prometheus.scrape(f"http://127.0.0.1:{argv[argv.index('--port') + 1]}", timeout=5.0)
    except Exception:  # argv.json not written yet, engine not listening yet
        return False
    return any(k.startswith("vllm:num_requests_running") and v >= 2 for k, v in samples.items())
