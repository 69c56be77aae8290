"""Keep the load generator's CPU apart from an engine that runs on the same host's CPUs.

A CPU build of an engine (vLLM-CPU) takes every core it can: its OpenMP threads spin on all of
them, and a client sharing those cores is starved, so its event loop wakes late, timestamps
drift and requests are written into connections the server has already closed. On the 2-core
test bed one server measured three times spread up to 3.7× with shared cores, and within 8 % of
its median with the engine on core 0 and the client on core 1 (``docs/real-engine.md``).

So for a CPU engine the tuner partitions the cores it may use: the client keeps a quarter of
them (at least one, the highest-numbered), the engine gets the rest, pinned with ``taskset`` (the
whole process tree inherits it) and told through vLLM-CPU's own ``VLLM_CPU_OMP_THREADS_BIND``.
Neither appears in an exported launch script: they are how the tuner measures, not how the
engine is deployed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["CpuPartition", "format_cpus", "pinned", "plan_partition"]

CLIENT_SHARE = 0.25  # of the cores: the load generator needs little CPU but must never wait for it


@dataclass(frozen=True)
class CpuPartition:
    """Which cores the engine and the load generator run on."""

    engine: tuple[int, ...]
    client: tuple[int, ...]

    def engine_prefix(self) -> list[str]:
        """The argv prefix that starts the engine on its cores (the process tree inherits it)."""
        return ["taskset", "-c", format_cpus(self.engine)]

    def engine_env(self, user_env: dict[str, str]) -> dict[str, str]:
        """vLLM-CPU's thread binding for the engine's cores, unless the user set their own."""
        if "VLLM_CPU_OMP_THREADS_BIND" in user_env:
            return {}
        return {"VLLM_CPU_OMP_THREADS_BIND": format_cpus(self.engine)}

    def to_json(self) -> dict[str, Any]:
        return {"engine_cpus": format_cpus(self.engine), "client_cpus": format_cpus(self.client)}

    def describe(self) -> str:
        return (
            f"CPU engine: engine pinned to core(s) {format_cpus(self.engine)}, the load generator to "
            f"core(s) {format_cpus(self.client)}, so the client is never starved by the engine"
        )


def format_cpus(cpus: tuple[int, ...]) -> str:
    """``(0, 1, 2, 5)`` → ``"0-2,5"`` (the list syntax of taskset and VLLM_CPU_OMP_THREADS_BIND)."""
    parts: list[str] = []
    start = prev = None
    for cpu in sorted(cpus):
        if prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    if start is not None:
        parts.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def plan_partition(cpus: set[int] | None = None) -> CpuPartition | None:
    """The split of ``cpus`` (default: the cores this process may use); None with fewer than two
    cores or without ``taskset`` (then engine and client share, and runs are noisier)."""
    if cpus is None:
        try:
            cpus = os.sched_getaffinity(0)
        except AttributeError:  # not Linux
            return None
    ordered = sorted(cpus)
    if len(ordered) < 2 or shutil.which("taskset") is None:
        return None
    n_client = max(1, int(len(ordered) * CLIENT_SHARE))
    return CpuPartition(engine=tuple(ordered[:-n_client]), client=tuple(ordered[-n_client:]))


@contextlib.contextmanager
def pinned(cpus: tuple[int, ...] | None) -> Iterator[None]:
    """Run the calling thread (and the processes it starts) on ``cpus``, then restore."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
