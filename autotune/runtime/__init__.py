"""Engine process supervision, GPU (NVML) inspection and ports.

Nothing here knows an engine dialect: adapters (``autotune.engines``) say what to run and what
readiness means; this package runs it, watches it and makes sure every process of it ends.
"""

from autotune.runtime.allocator import GpuAllocator, GpuGroup
from autotune.runtime.gpu import (
    FAKE_GPUS_ENV,
    GpuBackend,
    GpuInfo,
    list_gpus,
    memory_used_by_pid,
    wait_memory_at_most,
    wait_pids_released,
)
from autotune.runtime.ports import ensure_port_free, free_port, port_is_free
from autotune.runtime.process import EngineProcess
from autotune.runtime.procfs import ENGINE_MARKER_ENV, pids_in_group
from autotune.runtime.reaper import Leftover, find_leftovers, reap_process_groups

__all__ = [
    "ENGINE_MARKER_ENV",
    "FAKE_GPUS_ENV",
    "EngineProcess",
    "GpuAllocator",
    "GpuBackend",
    "GpuGroup",
    "GpuInfo",
    "Leftover",
    "ensure_port_free",
    "find_leftovers",
    "free_port",
    "list_gpus",
    "memory_used_by_pid",
    "pids_in_group",
    "port_is_free",
    "reap_process_groups",
    "wait_memory_at_most",
    "wait_pids_released",
]
