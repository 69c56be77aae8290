"""GPU groups for trials that run at the same time on one box.

Each trial needs a group of TP × PP × DP devices that no other engine uses. The allocator
hands groups out of a pool (every device NVML lists, or the ``--gpus`` subset) and takes them
back when a trial ends. A device is given out only when NVML shows it idle: no process on it
and memory back near the idle level. So a group returned by a finished trial waits until the
engine's processes are gone and the driver has released its memory, and a device that someone
else's process takes meanwhile is skipped while that process holds it.

Groups follow NVLink: a multi-GPU group is cut from one NVLink island when some island of the
pool is large enough (waiting for one rather than spanning PCIe, so trials of the same size are
measured on the same kind of link), and single-GPU trials go to the fullest island first, which
keeps large islands whole for tensor-parallel trials. Requests are served first come, first
served, so a TP-4 trial is not starved by a stream of single-GPU ones.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from autotune.errors import ConfigError, TeardownError
from autotune.runtime.gpu import GpuBackend, GpuInfo, idle_limit, list_gpus, nvlink_islands

__all__ = ["AllocatorClosed", "GpuAllocator", "GpuGroup", "choose_group"]

log = logging.getLogger(__name__)

_MIB = 1024**2


class AllocatorClosed(RuntimeError):
    """The allocator was closed (the run is stopping) while a trial waited for a group."""


@dataclass(frozen=True)
class GpuGroup:
    """Devices (NVML indices) given to one engine."""

    devices: tuple[int, ...]

    def env(self) -> dict[str, str]:
        """The engine's view of its group. NVML numbers devices in PCI bus order; CUDA's default
        order is "fastest first", so the engine must be told to count the same way."""
        return {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": ",".join(map(str, self.devices))}

    def __str__(self) -> str:
        return f"GPU {','.join(map(str, self.devices))}"


# ------------------------------------------------------------------------------ choosing a group
def _aligned(devices: Sequence[int], size: int) -> tuple[int, ...]:
    """From one island's free devices: an aligned consecutive block (0-1, 2-3 ...) if there is
    one, then any consecutive run, then the lowest indices. Aligned blocks leave the rest of the
    island in blocks too."""
    free = set(devices)
    starts = sorted(free)
    for aligned_only in (True, False):
        for start in starts:
            if (not aligned_only or start % size == 0) and all(start + k in free for k in range(size)):
                return tuple(range(start, start + size))
    return tuple(starts[:size])


def choose_group(free: Sequence[int], size: int, islands: Sequence[Sequence[int]]) -> tuple[int, ...] | None:
    """The devices to give a trial that needs ``size``, or None to wait.

    Args:
        free: Devices available right now.
        size: Devices the trial needs.
        islands: NVLink islands of the whole pool (free or not).
    """
    free_set = set(free)
    if len(free_set) < size:
        return None
    if size == 1 or any(len(island) >= size for island in islands):
        fits = [[d for d in island if d in free_set] for island in islands]
        candidates = [f for f in fits if len(f) >= size]
        if not candidates:
            return None  # an NVLink group will come free: wait for it
        # Best fit: the island with the fewest free devices that still holds the group.
        best = min(candidates, key=lambda f: (len(f), f[0]))
        return _aligned(best, size)
    return tuple(sorted(free_set)[:size])


# ------------------------------------------------------------------------------ the allocator
class GpuAllocator:
    """Hands out disjoint GPU groups; thread-safe.

    Args:
        backend: Where device state comes from (NVML, or pretend GPUs).
        devices: The pool (``--gpus``); None means every device the backend lists.
        release_timeout_s: How long a returned device may stay busy before it is dropped from the
            pool with a warning (a process that will not let go of it).
        poll_s: How often a waiting request looks at the devices again.

    Raises:
        ConfigError: When ``devices`` names a device the backend does not list, or when no
            device of the pool is free at the start.
    """

    def __init__(
        self,
        backend: GpuBackend,
        devices: Sequence[int] | None = None,
        *,
        release_timeout_s: float = 120.0,
        poll_s: float = 0.5,
    ):
        self.backend = backend
        self.release_timeout_s, self.poll_s = release_timeout_s, poll_s
        infos = {g.index: g for g in list_gpus(backend)}
        wanted = sorted(set(devices)) if devices is not None else sorted(infos)
        unknown = [d for d in wanted if d not in infos]
        if unknown:
            have = ", ".join(map(str, sorted(infos))) or "none"
            raise ConfigError(f"--gpus names GPU {unknown[0]}, which this machine does not have (GPUs: {have})")
        #: Devices left out at the start, with the reason (another process holds them).
        self.skipped = {d: why for d in wanted if (why := self._busy_reason(infos[d]))}
        self.pool = tuple(d for d in wanted if d not in self.skipped)
        if not self.pool:
            detail = "; ".join(f"GPU {d}: {why}" for d, why in self.skipped.items())
            raise ConfigError(f"no free GPU to run trials on ({detail}); free one or choose others with --gpus")
        self.islands = nvlink_islands(self.pool, backend)
        #: Devices dropped while running (not released in time), with the reason.
        self.lost: dict[int, str] = {}
        self._held: dict[int, GpuGroup] = {}
        self._returned_at: dict[int, float] = {}
        self._queue: deque[object] = deque()
        self._cond = threading.Condition()
        self._closed = False

    # -- sizing
    def usable(self) -> tuple[int, ...]:
        return tuple(d for d in self.pool if d not in self.lost)

    def groups_at_once(self, size: int) -> int:
        """How many groups of ``size`` the pool holds at the same time (0: none fits)."""
        islands = [[d for d in island if d not in self.lost] for island in self.islands]
        free, count = list(self.usable()), 0
        while (group := choose_group(free, size, islands)) is not None:
            free = [d for d in free if d not in group]
            count += 1
        return count

    # -- handing out and taking back
    def acquire(self, size: int) -> GpuGroup:
        """Wait for a group of ``size`` idle devices, first come first served, and hold it.

        Raises:
            ConfigError: When the pool can never hold a group this large.
            TeardownError: When devices the request needs were dropped (not released in time).
            AllocatorClosed: When :meth:`close` is called while waiting.
        """
        ticket = object()
        with self._cond:
            self._check_possible(size)
            self._queue.append(ticket)
            try:
                while True:
                    if self._closed:
                        raise AllocatorClosed("the run is stopping; no GPU group given out")
                    group = self._pick(size) if self._queue[0] is ticket else None
                    if group is not None:
                        return group
                    self._check_possible(size)  # devices may have been dropped meanwhile
                    self._cond.wait(self.poll_s)
            finally:
                self._queue.remove(ticket)
                self._cond.notify_all()

    def try_acquire(self, size: int) -> GpuGroup | None:
        """A group at once, or None (also when an earlier request is still waiting)."""
        with self._cond:
            self._check_possible(size)
            return None if self._queue or self._closed else self._pick(size)

    def release(self, group: GpuGroup) -> None:
        """Give the group back. Its devices are handed out again once NVML shows them idle."""
        with self._cond:
            now = time.monotonic()
            for d in group.devices:
                if self._held.get(d) is group:
                    del self._held[d]
                    self._returned_at[d] = now
            self._cond.notify_all()

    @contextlib.contextmanager
    def lease(self, size: int) -> Iterator[GpuGroup]:
        """Hold a group of ``size`` for the duration of a ``with`` block."""
        group = self.acquire(size)
        try:
            yield group
        finally:
            self.release(group)

    def close(self) -> None:
        """Wake every waiting request with :class:`AllocatorClosed`."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def held(self) -> dict[int, GpuGroup]:
        with self._cond:
            return dict(self._held)

    def waiting(self) -> int:
        """How many :meth:`acquire` calls are queued (waiting for a group) right now."""
        with self._cond:
            return len(self._queue)

    # -- internals (called with the lock held)
    def _check_possible(self, size: int) -> None:
        if size > len(self.pool):
            raise ConfigError(
                f"a trial needs {size} GPUs (TP × PP × DP) but the pool has {len(self.pool)} free "
                f"({', '.join(map(str, self.pool))}); lower the parallel sizes or add GPUs with --gpus"
            )
        if size > len(self.usable()):
            lost = "; ".join(f"GPU {d}: {why}" for d, why in self.lost.items())
            raise TeardownError(f"a trial needs {size} GPUs but only {len(self.usable())} are left ({lost})")

    def _pick(self, size: int) -> GpuGroup | None:
        candidates = [d for d in self.usable() if d not in self._held]
        free = [d for d in candidates if self._idle(d)]
        self._drop_stuck([d for d in candidates if d not in free])
        islands = [[d for d in island if d not in self.lost] for island in self.islands]
        chosen = choose_group(free, size, islands)
        if chosen is None:
            return None
        group = GpuGroup(chosen)
        for d in chosen:
            self._held[d] = group
        return group

    def _idle(self, device: int) -> bool:
        idle = self._busy_reason(self.backend.info(device)) is None
        if idle:
            self._returned_at.pop(device, None)
        return idle

    def _busy_reason(self, info: GpuInfo) -> str | None:
        holders = self.backend.process_memory(info.index)
        if holders:
            pids = ", ".join(f"{pid} ({used // _MIB} MiB)" for pid, used in sorted(holders.items()))
            return f"held by PID {pids}"
        if info.memory_used > idle_limit(info):
            return f"{info.memory_used // _MIB} MiB in use by a process NVML cannot see"
        return None

    def _drop_stuck(self, busy: Sequence[int]) -> None:
        """Devices we returned that are still busy long after: drop them, say why."""
        now = time.monotonic()
        for d in busy:
            since = self._returned_at.get(d)
            if since is not None and now - since > self.release_timeout_s:
                why = self._busy_reason(self.backend.info(d)) or "busy"
                self.lost[d] = f"not released {self.release_timeout_s:.0f}s after its engine stopped ({why})"
                del self._returned_at[d]
                log.warning("GPU %d dropped from the pool: %s", d, self.lost[d])
