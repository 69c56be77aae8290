"""GPU groups for parallel trials: choice (NVLink, best fit, alignment), waiting for released
memory, first-come-first-served, foreign processes, and the property that no GPU ever serves two
engines at once."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Sequence

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from autotune.errors import ConfigError, TeardownError
from autotune.runtime.allocator import AllocatorClosed, GpuAllocator, GpuGroup, choose_group
from autotune.runtime.gpu import GpuInfo

GIB = 1024**3
IDLE = GIB // 2


class Box:
    """An in-memory GPU box. Engines hold their devices while running and, once stopped, for as
    long as the test keeps them ``lingering`` (the driver tearing a context down)."""

    def __init__(self, count: int, islands: Sequence[Sequence[int]] | None = None, foreign: Sequence[int] = ()):
        self.count = count
        self.islands = [set(i) for i in (islands if islands is not None else [range(count)])]
        self.running: dict[int, tuple[int, ...]] = {}
        self.lingering: dict[int, tuple[int, ...]] = {}
        self.foreign: set[int] = set(foreign)
        self._next_pid = 1000
        self.polls = 0
        self.lock = threading.Lock()

    def start(self, devices: Sequence[int]) -> int:
        with self.lock:
            self._next_pid += 1
            self.running[self._next_pid] = tuple(devices)
            return self._next_pid

    def stop(self, pid: int, *, linger: bool = False) -> None:
        with self.lock:
            devices = self.running.pop(pid)
            if linger:
                self.lingering[pid] = devices

    def let_go(self) -> None:
        with self.lock:
            self.lingering.clear()

    def holders(self, index: int) -> dict[int, int]:
        with self.lock:
            self.polls += 1  # one device looked at: lets tests count the allocator's polling rounds
            procs = {**self.running, **self.lingering}
            held = {pid: 70 * GIB for pid, devices in procs.items() if index in devices}
            if index in self.foreign:
                held[1] = 5 * GIB
            return held

    # GpuBackend + GpuTopology
    def device_count(self) -> int:
        return self.count

    def info(self, index: int) -> GpuInfo:
        return GpuInfo(index, f"GPU-{index}", "Test H100", 80 * GIB, IDLE + sum(self.holders(index).values()))

    def process_memory(self, index: int) -> dict[int, int]:
        return self.holders(index)

    def nvlinked(self, a: int, b: int) -> bool:
        return a != b and any(a in i and b in i for i in self.islands)


# ------------------------------------------------------------------------------ choosing
def test_single_gpu_trials_fill_the_fullest_island_first() -> None:
    islands = [(0, 1, 2, 3), (4, 5)]
    assert choose_group([0, 1, 2, 3, 4, 5], 1, islands) == (4,)
    assert choose_group([0, 1, 2, 3, 5], 1, islands) == (5,)


def test_tp_groups_stay_inside_an_nvlink_island_and_aligned() -> None:
    islands = [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert choose_group([1, 2, 3, 4, 5, 6, 7], 2, islands) == (2, 3)  # best fit, aligned block
    assert choose_group([0, 1, 2, 3, 4, 5, 6, 7], 4, islands) == (0, 1, 2, 3)
    assert choose_group([1, 2, 3, 4, 6, 7], 4, islands) is None  # wait rather than span PCIe
    assert choose_group([1, 2, 5, 6], 2, islands) == (1, 2)  # no aligned block: a consecutive one


def test_groups_span_islands_only_when_no_island_is_large_enough() -> None:
    pcie = [(0,), (1,), (2,), (3,)]
    assert choose_group([1, 3], 2, pcie) == (1, 3)
    assert choose_group([3], 2, pcie) is None


# ------------------------------------------------------------------------------ the pool
def test_busy_and_unknown_devices() -> None:
    box = Box(4, foreign=[2])
    allocator = GpuAllocator(box)
    assert allocator.pool == (0, 1, 3)
    assert "held by PID 1 (5120 MiB)" in allocator.skipped[2]
    assert GpuAllocator(box, [1, 3]).pool == (1, 3)
    with pytest.raises(ConfigError, match="--gpus names GPU 7"):
        GpuAllocator(box, [0, 7])
    with pytest.raises(ConfigError, match="no free GPU"):
        GpuAllocator(box, [2])
    with pytest.raises(ConfigError, match="needs 4 GPUs"):
        allocator.acquire(4)


def test_groups_at_once_follows_the_islands() -> None:
    allocator = GpuAllocator(Box(8, islands=[range(4), range(4, 8)]))
    # 8 exceeds every island, so that group spans them (the only way to run it at all).
    assert [allocator.groups_at_once(n) for n in (1, 2, 4, 8)] == [8, 4, 2, 1]
    assert GpuAllocator(Box(4, islands=[])).groups_at_once(2) == 2  # PCIe only: spans


def test_a_returned_group_waits_until_the_engine_memory_is_released() -> None:
    box = Box(2)
    allocator = GpuAllocator(box, poll_s=0.01)
    group = allocator.acquire(2)
    pid = box.start(group.devices)
    assert allocator.try_acquire(1) is None  # held
    box.stop(pid, linger=True)
    allocator.release(group)
    assert allocator.try_acquire(1) is None  # returned, but the driver still holds the memory
    box.let_go()
    assert allocator.try_acquire(2) == GpuGroup((0, 1))


def test_a_device_taken_by_someone_else_is_skipped_while_they_hold_it() -> None:
    box = Box(2)
    allocator = GpuAllocator(box)
    box.foreign.add(0)
    assert allocator.try_acquire(1) == GpuGroup((1,))
    assert allocator.try_acquire(1) is None
    box.foreign.clear()
    assert allocator.try_acquire(1) == GpuGroup((0,))


def _wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Wait for a state (threads are ordered by what the allocator shows, never by sleeps); the
    timeout only bounds a broken allocator."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.001)


def test_requests_are_served_in_order_so_large_groups_are_not_starved() -> None:
    box = Box(4)
    allocator = GpuAllocator(box, poll_s=0.01)
    singles = [allocator.acquire(1) for _ in range(4)]
    order: list[str] = []

    def want(name: str, size: int) -> None:
        group = allocator.acquire(size)
        order.append(name)
        allocator.release(group)

    big = threading.Thread(target=want, args=("tp4", 4))
    big.start()
    _wait_until(lambda: allocator.waiting() == 1, "the TP-4 request is queued")
    small = threading.Thread(target=want, args=("tp1", 1))
    small.start()
    _wait_until(lambda: allocator.waiting() == 2, "the TP-1 request is queued behind it")
    allocator.release(singles[0])  # one device frees: the later single request must not take it
    # Let the waiting requests look at the devices many times after the release: the head
    # request reads the freed device's state (two backend calls) every round, and both requests
    # wake on the release and on every poll_s timeout. Counted, not timed.
    polled = box.polls
    _wait_until(lambda: box.polls >= polled + 20, "about ten more polling rounds")
    assert order == [] and allocator.waiting() == 2
    for group in singles[1:]:
        allocator.release(group)
    big.join(30)
    small.join(30)
    assert order == ["tp4", "tp1"]


def test_close_wakes_waiting_requests() -> None:
    allocator = GpuAllocator(Box(1), poll_s=0.01)
    allocator.acquire(1)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            allocator.acquire(1)
        except AllocatorClosed as err:
            errors.append(err)

    waiter = threading.Thread(target=wait)
    waiter.start()
    _wait_until(lambda: allocator.waiting() == 1, "the request is waiting")
    allocator.close()
    waiter.join(30)
    assert not waiter.is_alive() and len(errors) == 1
    assert allocator.waiting() == 0


def test_a_device_never_released_is_dropped_and_named() -> None:
    box = Box(1)
    allocator = GpuAllocator(box, release_timeout_s=0.05, poll_s=0.01)
    group = allocator.acquire(1)
    box.start(group.devices)  # an engine that never lets go
    allocator.release(group)
    with pytest.raises(TeardownError, match="GPU 0: not released"):
        allocator.acquire(1)
    assert 0 in allocator.lost


def test_env_pins_the_engine_to_its_group_in_nvml_order() -> None:
    assert GpuGroup((4, 5)).env() == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "4,5"}


# ------------------------------------------------------------------------------ properties
class AllocatorMachine(RuleBasedStateMachine):
    """Random acquire / engine start (later) / stop (with or without lingering memory) / release
    / foreign processes: a device is never given to a second engine, and never while anything
    (our stopped engine, someone else) still holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.box = Box(6, islands=[range(4), range(4, 6)])
        self.allocator = GpuAllocator(self.box, poll_s=0.0)
        self.groups: list[tuple[GpuGroup, int | None]] = []  # group, its engine's pid

    @rule(size=st.sampled_from([1, 1, 2, 4]))
    def acquire(self, size: int) -> None:
        busy_before = {d for d in range(6) if self.box.holders(d)}
        group = self.allocator.try_acquire(size)
        if group is None:
            return
        assert len(group.devices) == size
        assert not set(group.devices) & busy_before, "handed out a device something still holds"
        for other, _ in self.groups:
            assert not set(group.devices) & set(other.devices), "one device in two groups"
        # The engine takes a while to allocate memory: until then NVML shows the group idle.
        self.groups.append((group, None))

    @precondition(lambda self: any(pid is None for _, pid in self.groups))
    @rule(data=st.data())
    def engine_allocates(self, data: st.DataObject) -> None:
        waiting = [i for i, (_, pid) in enumerate(self.groups) if pid is None]
        i = data.draw(st.sampled_from(waiting))
        group = self.groups[i][0]
        self.groups[i] = (group, self.box.start(group.devices))

    @precondition(lambda self: self.groups)
    @rule(data=st.data(), linger=st.booleans())
    def finish(self, data: st.DataObject, linger: bool) -> None:
        group, pid = self.groups.pop(data.draw(st.integers(0, len(self.groups) - 1)))
        if pid is not None:
            self.box.stop(pid, linger=linger)
        self.allocator.release(group)

    @rule()
    def driver_lets_go(self) -> None:
        self.box.let_go()

    @rule(device=st.integers(0, 5), present=st.booleans())
    def someone_else(self, device: int, present: bool) -> None:
        (self.box.foreign.add if present else self.box.foreign.discard)(device)

    @invariant()
    def groups_are_disjoint(self) -> None:
        seen: list[int] = [d for group, _ in self.groups for d in group.devices]
        assert len(seen) == len(set(seen))
        assert set(self.allocator.held()) == set(seen)


TestAllocatorMachine = AllocatorMachine.TestCase
TestAllocatorMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_threads_leasing_groups_never_share_a_gpu() -> None:
    box = Box(4, islands=[range(4)])
    allocator = GpuAllocator(box, poll_s=0.001)
    in_use: dict[int, int] = {}
    lock = threading.Lock()
    clashes: list[str] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(15):
            with allocator.lease(rng.choice([1, 1, 2])) as group:
                with lock:
                    clashes.extend(f"GPU {d}" for d in group.devices if d in in_use)
                    in_use.update(dict.fromkeys(group.devices, seed))
                pid = box.start(group.devices)
                time.sleep(rng.random() / 500)
                with lock:
                    for d in group.devices:
                        in_use.pop(d, None)
                box.stop(pid, linger=rng.random() < 0.3)

    def driver(stop: threading.Event) -> None:  # lets go of stopped engines' memory, now and then
        while not stop.wait(0.003):
            box.let_go()

    stop = threading.Event()
    releaser = threading.Thread(target=driver, args=(stop,))
    releaser.start()
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stop.set()
    releaser.join()
    assert not clashes
    assert not any(t.is_alive() for t in threads)
