"""Host memory read by vLLM-CPU's own arithmetic, from a pretend /sys and /proc."""

from __future__ import annotations

from pathlib import Path

from autotune.runtime.hostmem import GIB, node_memory

NODE0 = """\
Node 0 MemTotal:       16777216 kB
Node 0 MemFree:         4194304 kB
Node 0 MemUsed:        12582912 kB
Node 0 Active(file):    1048576 kB
Node 0 Inactive(file):  1048576 kB
Node 0 SReclaimable:     524288 kB
"""


def _write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_available_is_free_plus_file_pages_plus_reclaimable(tmp_path: Path) -> None:
    _write(tmp_path, "sys/devices/system/node/node0/meminfo", NODE0)
    mem = node_memory(root=tmp_path)
    assert mem.total == 16 * GIB
    assert mem.available == int(6.5 * GIB)  # 4 free + 1 + 1 file pages + 0.5 reclaimable
    assert mem.describe() == "6.50/16.00 GiB available"


def test_a_smaller_cgroup_limit_clamps_both(tmp_path: Path) -> None:
    _write(tmp_path, "sys/devices/system/node/node0/meminfo", NODE0)
    _write(tmp_path, "sys/fs/cgroup/memory.max", str(8 * GIB))
    _write(tmp_path, "sys/fs/cgroup/memory.current", str(5 * GIB))
    mem = node_memory(root=tmp_path)
    assert (mem.total, mem.available) == (8 * GIB, 3 * GIB)


def test_without_numa_files_the_system_totals_count(tmp_path: Path) -> None:
    _write(tmp_path, "proc/meminfo", "MemTotal: 8388608 kB\nMemFree: 1048576 kB\nMemAvailable: 4194304 kB\n")
    _write(tmp_path, "sys/fs/cgroup/memory.max", "max")
    mem = node_memory(root=tmp_path)
    assert (mem.total, mem.available) == (8 * GIB, 4 * GIB)
