"""GPU inspection through NVML (``pynvml`` from nvidia-ml-py): devices, memory, per-PID usage.

Used between trials: an engine that was killed may hold GPU memory for a moment longer, and
vLLM refuses to start while free memory is below its budget, so the next launch waits here
until the previous engine's PIDs hold nothing.

Everything degrades to "no GPUs" when NVML is missing (no driver, no library, a CPU box): the
listing is empty and the waits return at once. Device indices are NVML's, which follow PCI bus
order; engines see the same numbering when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. In a container
with its own PID namespace NVML may report host PIDs; then compare memory with
:func:`wait_memory_at_most` instead of by PID.

``AUTOTUNE_FAKE_GPUS`` (e.g. ``8xH100-80GB``) replaces NVML with pretend devices
(:mod:`autotune.runtime.fakegpu`), so GPU placement is exercised on machines without a GPU.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from autotune.errors import TeardownError

__all__ = [
    "FAKE_GPUS_ENV",
    "GpuBackend",
    "GpuInfo",
    "GpuTopology",
    "NvmlBackend",
    "default_backend",
    "idle_limit",
    "list_gpus",
    "memory_used_by_pid",
    "nvlink_islands",
    "wait_memory_at_most",
    "wait_pids_released",
]

log = logging.getLogger(__name__)

_MIB = 1024**2
_GIB = 1024**3

#: Environment variable that swaps NVML for pretend GPUs (see :mod:`autotune.runtime.fakegpu`).
FAKE_GPUS_ENV = "AUTOTUNE_FAKE_GPUS"


@dataclass(frozen=True)
class GpuInfo:
    """One device as NVML sees it; memory in bytes."""

    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int


class GpuBackend(Protocol):
    """What autotune needs from NVML; tests substitute a fake."""

    def device_count(self) -> int: ...

    def info(self, index: int) -> GpuInfo: ...

    def process_memory(self, index: int) -> dict[int, int]:
        """PID → bytes that process holds on device ``index`` (0 when the driver does not say)."""
        ...


@runtime_checkable
class GpuTopology(Protocol):
    """A backend that knows which devices are joined by NVLink (optional for a backend)."""

    def nvlinked(self, a: int, b: int) -> bool: ...


class NvmlBackend:
    """:class:`GpuBackend` over ``pynvml``. Build it with :meth:`load`."""

    def __init__(self, nvml: Any):
        self._nvml = nvml

    @classmethod
    def load(cls) -> NvmlBackend | None:
        """Initialise NVML, or return None when it is unavailable (logged at debug level)."""
        try:
            import pynvml
        except ImportError:
            log.debug("pynvml is not installed; treating this machine as having no GPUs")
            return None
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as err:
            log.debug("NVML unavailable (%s); treating this machine as having no GPUs", err)
            return None
        return cls(pynvml)

    def device_count(self) -> int:
        return int(self._nvml.nvmlDeviceGetCount())

    def info(self, index: int) -> GpuInfo:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        return GpuInfo(
            index=index,
            uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
            name=_text(nvml.nvmlDeviceGetName(handle)),
            memory_total=int(memory.total),
            memory_used=int(memory.used),
        )

    def process_memory(self, index: int) -> dict[int, int]:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        usage: dict[int, int] = {}
        for query in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                processes = query(handle)
            except nvml.NVMLError as err:
                log.debug("NVML process query failed on GPU %d: %s", index, err)
                continue
            for proc in processes:
                # usedGpuMemory is None where the driver cannot attribute memory (e.g. WDDM).
                usage[int(proc.pid)] = usage.get(int(proc.pid), 0) + int(proc.usedGpuMemory or 0)
        return usage

    def nvlinked(self, a: int, b: int) -> bool:
        """Whether devices ``a`` and ``b`` talk peer to peer over NVLink (False when NVML cannot say)."""
        nvml = self._nvml
        try:
            status = nvml.nvmlDeviceGetP2PStatus(
                nvml.nvmlDeviceGetHandleByIndex(a), nvml.nvmlDeviceGetHandleByIndex(b), nvml.NVML_P2P_CAPS_INDEX_NVLINK
            )
        except (nvml.NVMLError, AttributeError) as err:  # old drivers or bindings lack the query
            log.debug("NVLink query failed for GPUs %d,%d: %s", a, b, err)
            return False
        return bool(status == nvml.NVML_P2P_STATUS_OK)


def _text(value: str | bytes) -> str:
    # Older pynvml releases return bytes.
    return value.decode() if isinstance(value, bytes) else value


_DEFAULT: list[GpuBackend | None] = []  # filled once: NVML init is slow and process-wide


_FAKES: dict[str, GpuBackend] = {}  # one per spec, so pretend devices keep their state


def default_backend() -> GpuBackend | None:
    """The process-wide GPU backend: pretend GPUs when ``AUTOTUNE_FAKE_GPUS`` is set, else NVML
    (None on a machine without NVML).

    Raises:
        ConfigError: When ``AUTOTUNE_FAKE_GPUS`` cannot be parsed.
    """
    spec = os.environ.get(FAKE_GPUS_ENV)
    if spec:
        if spec not in _FAKES:
            from autotune.runtime.fakegpu import FakeBackend  # only tests and demos pay for it

            _FAKES[spec] = FakeBackend.from_spec(spec)
        return _FAKES[spec]
    if not _DEFAULT:
        _DEFAULT.append(NvmlBackend.load())
    return _DEFAULT[0]


def _resolve(backend: GpuBackend | None) -> GpuBackend | None:
    return backend if backend is not None else default_backend()


def list_gpus(backend: GpuBackend | None = None) -> list[GpuInfo]:
    """Every device with its memory; empty without NVML."""
    nvml = _resolve(backend)
    if nvml is None:
        return []
    return [nvml.info(i) for i in range(nvml.device_count())]


def idle_limit(info: GpuInfo) -> int:
    """Memory an idle device may show as used: the driver and ECC reserve some (≈0.5 GiB on an
    H100) before any process runs. Above this a device counts as taken."""
    return max(_GIB, info.memory_total // 50)


def _unlinked(a: int, b: int) -> bool:
    return False


def nvlink_islands(indices: Iterable[int], backend: GpuBackend | None = None) -> list[tuple[int, ...]]:
    """Split ``indices`` into groups joined by NVLink (connected components), sorted.

    A backend that cannot tell topology puts every device in its own island.
    """
    nvml = _resolve(backend)
    remaining = sorted(set(indices))
    linked = nvml.nvlinked if isinstance(nvml, GpuTopology) else _unlinked
    islands: list[tuple[int, ...]] = []
    while remaining:
        island, frontier = {remaining[0]}, [remaining[0]]
        while frontier:
            current = frontier.pop()
            for other in remaining:
                if other not in island and linked(current, other):
                    island.add(other)
                    frontier.append(other)
        islands.append(tuple(sorted(island)))
        remaining = [i for i in remaining if i not in island]
    return islands


def memory_used_by_pid(backend: GpuBackend | None = None) -> dict[int, int]:
    """PID → bytes held across all devices; empty without NVML."""
    nvml = _resolve(backend)
    if nvml is None:
        return {}
    total: dict[int, int] = {}
    for index in range(nvml.device_count()):
        for pid, used in nvml.process_memory(index).items():
            total[pid] = total.get(pid, 0) + used
    return total


def wait_pids_released(
    pids: Iterable[int],
    *,
    timeout_s: float = 60.0,
    poll_s: float = 0.5,
    backend: GpuBackend | None = None,
) -> None:
    """Wait until none of ``pids`` holds GPU memory (returns at once without NVML).

    Raises:
        TeardownError: Naming the PIDs that still hold memory at the timeout.
    """
    wanted = set(pids)
    nvml = _resolve(backend)
    if nvml is None or not wanted:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        holding = {pid: used for pid, used in memory_used_by_pid(nvml).items() if pid in wanted}
        if not holding:
            return
        if time.monotonic() >= deadline:
            held = ", ".join(f"{pid} ({used // _MIB} MiB)" for pid, used in sorted(holding.items()))
            raise TeardownError(
                f"GPU memory still held after {timeout_s:.0f}s by PIDs {held}; "
                "end those processes before the next launch"
            )
        time.sleep(poll_s)


def wait_memory_at_most(
    limits: Mapping[int, int],
    *,
    timeout_s: float = 60.0,
    poll_s: float = 0.5,
    backend: GpuBackend | None = None,
) -> None:
    """Wait until each device's used memory is at most its limit (GPU index → bytes).

    Typically the limits are the memory in use before the previous engine started, plus a
    small tolerance. Returns at once without NVML.

    Raises:
        TeardownError: Naming the devices still above their limit at the timeout.
    """
    nvml = _resolve(backend)
    if nvml is None or not limits:
        return
    deadline = time.monotonic() + timeout_s
    while True:
        used = {i: nvml.info(i).memory_used for i in limits}
        over = {i: u for i, u in used.items() if u > limits[i]}
        if not over:
            return
        if time.monotonic() >= deadline:
            detail = ", ".join(
                f"GPU {i} {used // _MIB} MiB > {limits[i] // _MIB} MiB" for i, used in sorted(over.items())
            )
            raise TeardownError(
                f"GPU memory not released after {timeout_s:.0f}s: {detail}; another process holds it (see nvidia-smi)"
            )
        time.sleep(poll_s)
