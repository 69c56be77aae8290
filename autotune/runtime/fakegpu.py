"""Pretend GPUs for machines without one: ``AUTOTUNE_FAKE_GPUS=8xH100-80GB``.

The GPU module reads this variable in place of NVML (:func:`autotune.runtime.gpu.default_backend`),
so GPU placement — which devices are free, group sizes, NVLink preference, waiting for an
engine's memory to be released — runs unchanged in CI and with the simulated engine.

The devices look busy the way real ones do: an engine started by autotune (a live process whose
environment holds ``AUTOTUNE_ENGINE``, this same ``AUTOTUNE_FAKE_GPUS`` value and a
``CUDA_VISIBLE_DEVICES`` list) holds most of the memory of each device it was given, from start
until its process is gone, plus ``linger`` seconds, as a driver does while it tears a context down.

Spec: ``<count>x<name>-<N>GB`` then optional ``;key=value`` parts:

==============  ==================================================================================
``nvlink``      ``all`` (default: one NVSwitch island), ``none`` (PCIe only), or islands such as
                ``0-3,4-7``
``busy``        devices held by a process that is not autotune's, e.g. ``busy=3,5``
``linger``      seconds an engine's memory stays held after its process is gone (default 0)
``box``         a name that keeps two fake boxes on one machine apart (default ``default``)
==============  ==================================================================================
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import ConfigError
from autotune.runtime.gpu import FAKE_GPUS_ENV, GpuInfo
from autotune.runtime.procfs import ENGINE_MARKER_ENV

__all__ = ["FOREIGN_PID", "FakeBackend", "FakeGpuSpec"]

_GIB = 1024**3
#: What an idle pretend device shows as used (driver and ECC reservations).
IDLE_BYTES = _GIB // 2
#: Share of a device an engine holds (vLLM's default --gpu-memory-utilization).
ENGINE_SHARE = 0.9
#: The PID a ``busy=`` device reports: above Linux's pid_max, so it can never be a real process.
FOREIGN_PID = 2**22 + 1
_FOREIGN_BYTES = 10 * _GIB
_SCAN_TTL_S = 0.1  # one /proc scan serves every device query of one poll

_HEAD = re.compile(r"^\s*(\d+)\s*x\s*([A-Za-z0-9_.+-]+?-(\d+)GB)\s*$", re.IGNORECASE)


def _index_list(text: str, count: int, what: str) -> tuple[int, ...]:
    """``"0-3"`` / ``"3+5"`` / ``"3"`` → indices, each checked against ``count``."""
    out: list[int] = []
    for part in filter(None, re.split(r"[+,]", text)):
        low, sep, high = part.partition("-")
        try:
            span = range(int(low), int(high) + 1) if sep else range(int(low), int(low) + 1)
        except ValueError:
            raise ConfigError(f"{FAKE_GPUS_ENV}: {what} {text!r} is not a list of GPU indices") from None
        out.extend(span)
    bad = [i for i in out if not 0 <= i < count]
    if bad:
        raise ConfigError(f"{FAKE_GPUS_ENV}: {what} names GPU {bad[0]}, but the box has GPUs 0-{count - 1}")
    return tuple(sorted(set(out)))


@dataclass(frozen=True)
class FakeGpuSpec:
    """A parsed ``AUTOTUNE_FAKE_GPUS`` value."""

    text: str
    count: int
    name: str
    memory_total: int
    islands: tuple[tuple[int, ...], ...]
    busy: tuple[int, ...] = ()
    linger_s: float = 0.0
    box: str = "default"

    @classmethod
    def parse(cls, text: str) -> FakeGpuSpec:
        """Read a spec such as ``8xH100-80GB;nvlink=0-3,4-7;busy=5``.

        Raises:
            ConfigError: Naming the part that cannot be read.
        """
        head, *options = text.split(";")
        m = _HEAD.match(head)
        if not m:
            raise ConfigError(f"{FAKE_GPUS_ENV}={text!r}: start with <count>x<name>-<memory>GB, e.g. 8xH100-80GB")
        count, name, gib = int(m.group(1)), m.group(2), int(m.group(3))
        if count < 1:
            raise ConfigError(f"{FAKE_GPUS_ENV}={text!r}: the box needs at least one GPU")
        fields: dict[str, str] = {}
        for option in filter(None, (o.strip() for o in options)):
            key, sep, value = option.partition("=")
            if not sep or key not in ("nvlink", "busy", "linger", "box"):
                raise ConfigError(f"{FAKE_GPUS_ENV}: unknown option {option!r}; use nvlink=, busy=, linger= or box=")
            fields[key] = value.strip()
        return cls(
            text=text,
            count=count,
            name=f"Fake {name}",
            memory_total=gib * _GIB,
            islands=cls._islands(fields.get("nvlink", "all"), count),
            busy=_index_list(fields.get("busy", ""), count, "busy"),
            linger_s=cls._seconds(fields.get("linger", "0")),
            box=fields.get("box", "default"),
        )

    @staticmethod
    def _islands(text: str, count: int) -> tuple[tuple[int, ...], ...]:
        if text == "all":
            return (tuple(range(count)),)
        if text == "none":
            return tuple((i,) for i in range(count))
        islands = [_index_list(part, count, "nvlink island") for part in text.split(",")]
        seen = [i for island in islands for i in island]
        if len(seen) != len(set(seen)):
            raise ConfigError(f"{FAKE_GPUS_ENV}: nvlink islands {text!r} overlap")
        rest = [(i,) for i in range(count) if i not in seen]
        return tuple(sorted([*islands, *rest]))

    @staticmethod
    def _seconds(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{FAKE_GPUS_ENV}: linger={text!r} is not a number of seconds") from None
        if value < 0:
            raise ConfigError(f"{FAKE_GPUS_ENV}: linger must be ≥ 0 (got {text})")
        return value


def _environ(pid_dir: Path) -> dict[bytes, bytes]:
    try:
        raw = (pid_dir / "environ").read_bytes()
    except OSError:
        return {}
    return dict(item.partition(b"=")[::2] for item in raw.split(b"\0") if item)


def _is_group_leader(pid_dir: Path) -> bool:
    """One process per engine holds the memory: the leader of its process group (its session)."""
    try:
        stat = (pid_dir / "stat").read_text()
    except OSError:
        return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return len(fields) > 2 and fields[2] == pid_dir.name and fields[0] not in ("Z", "X")


class FakeBackend:
    """A :class:`autotune.runtime.gpu.GpuBackend` (with NVLink topology) over pretend devices."""

    def __init__(self, spec: FakeGpuSpec, proc: Path = Path("/proc"), clock: Callable[[], float] = time.monotonic):
        self.spec = spec
        self._proc = proc
        self._clock = clock  # a test's own clock makes the linger and the scan cache deterministic
        self._scan_at = -1.0
        self._engines: dict[int, tuple[int, ...]] = {}  # live engine PID → its devices
        self._gone: dict[int, tuple[tuple[int, ...], float]] = {}  # PID → (devices, seen gone at)

    @classmethod
    def from_spec(cls, text: str, clock: Callable[[], float] = time.monotonic) -> FakeBackend:
        return cls(FakeGpuSpec.parse(text), clock=clock)

    # -- GpuBackend
    def device_count(self) -> int:
        return self.spec.count

    def info(self, index: int) -> GpuInfo:
        self._check(index)
        used = IDLE_BYTES + sum(self.process_memory(index).values())
        return GpuInfo(index, f"GPU-fake-{self.spec.box}-{index}", self.spec.name, self.spec.memory_total, used)

    def process_memory(self, index: int) -> dict[int, int]:
        self._check(index)
        self._scan()
        share = int(self.spec.memory_total * ENGINE_SHARE)
        usage = {FOREIGN_PID: _FOREIGN_BYTES} if index in self.spec.busy else {}
        holders = {**{pid: devices for pid, (devices, _) in self._gone.items()}, **self._engines}
        usage.update({pid: share for pid, devices in holders.items() if index in devices})
        return usage

    # -- GpuTopology
    def nvlinked(self, a: int, b: int) -> bool:
        return a != b and any(a in island and b in island for island in self.spec.islands)

    # -- internals
    def _check(self, index: int) -> None:
        if not 0 <= index < self.spec.count:
            raise IndexError(f"fake GPU {index} does not exist (the box has {self.spec.count})")

    def _scan(self) -> None:
        """Find the engines on this fake box: autotune-launched process-group leaders whose
        environment carries this spec and a CUDA_VISIBLE_DEVICES list."""
        now = self._clock()
        if now - self._scan_at < _SCAN_TTL_S:
            return
        self._scan_at = now
        wanted = self.spec.text.encode()
        engines: dict[int, tuple[int, ...]] = {}
        for entry in self._proc.iterdir():
            if not entry.name.isdigit():
                continue
            env = _environ(entry)
            if env.get(FAKE_GPUS_ENV.encode()) != wanted or ENGINE_MARKER_ENV.encode() not in env:
                continue
            visible = env.get(b"CUDA_VISIBLE_DEVICES", b"").decode()
            devices = tuple(int(d) for d in visible.split(",") if d.strip().isdigit())
            if devices and _is_group_leader(entry):
                engines[int(entry.name)] = devices
        for pid, devices in self._engines.items():
            if pid not in engines:
                self._gone[pid] = (devices, now)
        self._gone = {pid: (devices, t) for pid, (devices, t) in self._gone.items() if now - t < self.spec.linger_s}
        self._engines = engines
