"""GPU inspection: the no-NVML path, the pynvml wrapper, and the waits, all without a GPU."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest

from autotune.errors import TeardownError
from autotune.runtime import gpu
from autotune.runtime.gpu import (
    GpuInfo,
    NvmlBackend,
    list_gpus,
    memory_used_by_pid,
    wait_memory_at_most,
    wait_pids_released,
)

GIB = 1024**3


class FakeGpus:
    """Two devices whose state advances on every poll (a query of device 0 starts a poll).

    ``tables[n]`` is, for poll ``n``, each device's PID → bytes table; the last one stays.
    """

    def __init__(self, tables: list[list[dict[int, int]]]):
        self.tables = tables
        self.polls = 0

    def _table(self, index: int) -> dict[int, int]:
        if index == 0:
            self.polls += 1
        return self.tables[min(self.polls, len(self.tables)) - 1][index]

    def device_count(self) -> int:
        return 2

    def info(self, index: int) -> GpuInfo:
        return GpuInfo(index, f"GPU-{index}", "Fake H100", 80 * GIB, sum(self._table(index).values()))

    def process_memory(self, index: int) -> dict[int, int]:
        return dict(self._table(index))


def test_without_nvml_there_are_no_gpus_and_waits_return(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as if not installed
    monkeypatch.setattr(gpu, "_DEFAULT", [])
    assert NvmlBackend.load() is None
    assert list_gpus() == []
    assert memory_used_by_pid() == {}
    wait_pids_released([1, 2, 3], timeout_s=0.0)
    wait_memory_at_most({0: 0}, timeout_s=0.0)


def test_nvml_init_failure_means_no_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    class NVMLError(Exception):
        pass

    def fail() -> None:
        raise NVMLError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", SimpleNamespace(NVMLError=NVMLError, nvmlInit=fail))
    assert NvmlBackend.load() is None


def _fake_pynvml() -> Any:
    class NVMLError(Exception):
        pass

    def graphics(handle: int) -> list[Any]:
        raise NVMLError("Not Supported")

    compute = {
        0: [SimpleNamespace(pid=100, usedGpuMemory=3 * GIB), SimpleNamespace(pid=101, usedGpuMemory=None)],
        1: [SimpleNamespace(pid=100, usedGpuMemory=1 * GIB)],
    }
    return SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H200" if h == 0 else "NVIDIA H200",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(total=141 * GIB, used=(4 if h == 0 else 1) * GIB),
        nvmlDeviceGetComputeRunningProcesses=lambda h: compute[h],
        nvmlDeviceGetGraphicsRunningProcesses=graphics,
    )


def test_pynvml_wrapper_reads_devices_and_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    backend = NvmlBackend.load()
    assert backend is not None
    gpus = list_gpus(backend)
    assert [g.name for g in gpus] == ["NVIDIA H200", "NVIDIA H200"]  # bytes names decoded
    assert gpus[0] == GpuInfo(0, "GPU-0", "NVIDIA H200", 141 * GIB, 4 * GIB)
    # Summed over devices; a PID the driver cannot attribute counts as holding 0 bytes.
    assert memory_used_by_pid(backend) == {100: 4 * GIB, 101: 0}


def test_wait_returns_once_pids_release_memory() -> None:
    fake = FakeGpus([[{7: GIB}, {}], [{7: GIB}, {}], [{}, {9: GIB}]])
    wait_pids_released([7, 8], timeout_s=10.0, poll_s=0.0, backend=fake)
    assert fake.polls == 3


def test_wait_times_out_naming_pids_and_memory() -> None:
    fake = FakeGpus([[{7: 2 * GIB}, {8: 512 * 1024**2}]])
    with pytest.raises(TeardownError) as info:
        wait_pids_released([7, 8, 9], timeout_s=0.05, poll_s=0.01, backend=fake)
    message = str(info.value)
    assert "7 (2048 MiB)" in message and "8 (512 MiB)" in message and "9 " not in message


def test_wait_for_memory_back_to_baseline() -> None:
    fake = FakeGpus([[{7: 10 * GIB}, {}], [{7: 1 * GIB}, {}]])
    wait_memory_at_most({0: 2 * GIB, 1: 0}, timeout_s=10.0, poll_s=0.0, backend=fake)
    assert fake.polls == 2
    stuck = FakeGpus([[{7: 10 * GIB}, {}]])
    with pytest.raises(TeardownError, match="GPU 0 10240 MiB > 2048 MiB"):
        wait_memory_at_most({0: 2 * GIB}, timeout_s=0.05, poll_s=0.01, backend=stuck)
