"""What a machine is, for the record kept with every study: CPU model and the instruction sets
that change an engine's code path, memory, GPUs, Python and platform.

A number measured on one host is only comparable with one from a host like it (vLLM-CPU's bf16
path, for one, differs on hosts with AMX), so the study's manifest carries these facts.
"""

from __future__ import annotations

import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

from autotune.runtime.gpu import list_gpus

__all__ = ["host_facts"]

# Instruction sets that select different kernels in the CPU engines (oneDNN, IPEX, vLLM-CPU).
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_int8", "amx_tile")


def host_facts() -> dict[str, Any]:
    """This host: name, platform, Python, CPU (model, cores, relevant flags), memory and GPUs."""
    model, flags = _cpuinfo()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": {"model": model, "cores": os.cpu_count(), "flags": [f for f in _CPU_FLAGS if f in flags]},
        "memory_bytes": _memory_total(),
        "gpus": [{"index": g.index, "name": g.name, "memory_bytes": g.memory_total} for g in list_gpus()],
    }


def _cpuinfo() -> tuple[str, set[str]]:
    """(model name, flags) from /proc/cpuinfo; the platform's processor name elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor(), set()
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())  # the first processor speaks for all
    return fields.get("model name", platform.processor()), set(fields.get("flags", "").split())


def _memory_total() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
