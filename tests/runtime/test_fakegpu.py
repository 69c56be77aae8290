"""Pretend GPUs (AUTOTUNE_FAKE_GPUS): the spec, topology, foreign processes, and engines that
hold their devices until their process is gone (plus the linger time)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from autotune.errors import ConfigError
from autotune.runtime import gpu
from autotune.runtime.fakegpu import FOREIGN_PID, IDLE_BYTES, FakeBackend, FakeGpuSpec
from autotune.runtime.gpu import FAKE_GPUS_ENV, default_backend, list_gpus, nvlink_islands, wait_memory_at_most
from autotune.runtime.process import EngineProcess

GIB = 1024**3


def test_spec_reads_count_memory_topology_and_busy_devices() -> None:
    spec = FakeGpuSpec.parse("8xA100-40GB;nvlink=0-3,4+5;busy=6,7;linger=1.5;box=t")
    assert (spec.count, spec.name, spec.memory_total) == (8, "Fake A100-40GB", 40 * GIB)
    assert spec.islands == ((0, 1, 2, 3), (4, 5), (6,), (7,))
    assert spec.busy == (6, 7) and spec.linger_s == 1.5 and spec.box == "t"
    assert FakeGpuSpec.parse("4xL4-24GB;nvlink=none").islands == ((0,), (1,), (2,), (3,))
    assert FakeGpuSpec.parse("2xH100-80GB").islands == ((0, 1),)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("eight H100s", "start with <count>x<name>-<memory>GB"),
        ("8xH100", "start with <count>x<name>-<memory>GB"),
        ("0xH100-80GB", "at least one GPU"),
        ("2xH100-80GB;busy=2", "names GPU 2, but the box has GPUs 0-1"),
        ("4xH100-80GB;nvlink=0-2,2-3", "overlap"),
        ("4xH100-80GB;colour=red", "unknown option"),
        ("4xH100-80GB;linger=soon", "not a number"),
    ],
)
def test_bad_specs_are_one_line_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        FakeGpuSpec.parse(text)


def test_environment_variable_replaces_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAKE_GPUS_ENV, "4xH100-80GB;nvlink=0-1,2-3;busy=3")
    monkeypatch.setattr(gpu, "_FAKES", {})
    backend = default_backend()
    assert isinstance(backend, FakeBackend)
    assert [g.index for g in list_gpus()] == [0, 1, 2, 3]
    assert list_gpus()[0].memory_used == IDLE_BYTES
    assert backend.process_memory(3) == {FOREIGN_PID: 10 * GIB}
    assert nvlink_islands(range(4)) == [(0, 1), (2, 3)]


def _engine_on(make_engine: Callable[..., EngineProcess], spec: str, devices: str) -> EngineProcess:
    engine = make_engine()
    engine.env.update({FAKE_GPUS_ENV: spec, "CUDA_VISIBLE_DEVICES": devices})
    return engine


class Clock:
    """The backend's clock, moved by the test: the scan cache and the linger are counted in it,
    so nothing depends on how fast this machine runs the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


SCAN = 0.2  # more than the backend's scan cache (0.1 s): every look after advance(SCAN) rescans


def _wait_seen(backend: FakeBackend, clock: Clock, index: int) -> None:
    """Wait (a real-time bound only for a broken run) until the backend sees an engine on ``index``."""
    deadline = time.monotonic() + 30
    while True:
        clock.advance(SCAN)
        if backend.process_memory(index):
            return
        assert time.monotonic() < deadline, f"no engine seen on fake GPU {index}"
        time.sleep(0.02)


@pytest.mark.sim
def test_an_engine_holds_its_devices_until_its_process_is_gone(make_engine: Callable[..., EngineProcess]) -> None:
    spec = "4xH100-80GB;box=hold"
    clock = Clock()
    backend = FakeBackend.from_spec(spec, clock=clock)
    engine = _engine_on(make_engine, spec, "1,2")
    with engine:
        _wait_seen(backend, clock, 1)
        assert set(backend.process_memory(1)) == {engine.pid}
        assert set(backend.process_memory(2)) == {engine.pid}
        assert backend.process_memory(0) == {} and backend.process_memory(3) == {}
        assert backend.info(1).memory_used > 70 * GIB
    # stop() returned: the whole group is gone. The next scan (past the cache) must say so.
    clock.advance(SCAN)
    assert backend.process_memory(1) == {}
    assert backend.info(1).memory_used == IDLE_BYTES


@pytest.mark.sim
def test_memory_lingers_after_the_engine_exits(make_engine: Callable[..., EngineProcess]) -> None:
    spec = "2xH100-80GB;linger=1;box=linger"
    clock = Clock()
    backend = FakeBackend.from_spec(spec, clock=clock)
    engine = _engine_on(make_engine, spec, "0")
    with engine:
        _wait_seen(backend, clock, 0)
    clock.advance(SCAN)  # the first scan after the stop finds the process gone: linger starts
    assert engine.pid in backend.process_memory(0)  # the driver has not let go yet
    clock.advance(0.7)
    assert engine.pid in backend.process_memory(0)  # 0.7 s into the 1 s linger: still held
    clock.advance(0.4)
    assert backend.process_memory(0) == {}  # 1.1 s: released
    wait_memory_at_most({0: 2 * GIB}, timeout_s=5, poll_s=0.01, backend=backend)  # returns at once


@pytest.mark.sim
def test_other_boxes_and_unmarked_processes_are_invisible(make_engine: Callable[..., EngineProcess]) -> None:
    clock = Clock()
    mine = FakeBackend.from_spec("2xH100-80GB;box=mine", clock=clock)
    theirs = FakeBackend.from_spec("2xH100-80GB;box=theirs", clock=clock)
    engine = _engine_on(make_engine, "2xH100-80GB;box=theirs", "0,1")
    with engine:
        _wait_seen(theirs, clock, 0)  # the engine is up and visible where it belongs ...
        assert mine.process_memory(0) == {} and mine.process_memory(1) == {}  # ... and only there
