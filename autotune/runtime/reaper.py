"""End engines left behind by a previous run of autotune that was itself killed.

A tuner killed with SIGKILL (or by a lost terminal) cannot stop its engine, and on a GPU box the
leftover keeps its memory, so the next start fails vLLM's free-memory check. Each trial records
its engine's process group ID; on start-up the caller passes those IDs here. A group is only
signalled if one of its processes still looks like an engine (an ``AUTOTUNE_ENGINE`` variable
in its environment, or an engine command line), because process group IDs are reused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass

from autotune.errors import TeardownError
from autotune.runtime.procfs import (
    ENGINE_MARKER_ENV,
    environ_value,
    pids_in_group,
    read_cmdline,
    terminate_group,
)

__all__ = ["ENGINE_CMDLINE_MARKERS", "Leftover", "find_leftovers", "looks_like_engine", "reap_process_groups"]

log = logging.getLogger(__name__)

#: Substrings of the command lines of engine processes (vLLM renames its children VLLM::...).
ENGINE_CMDLINE_MARKERS = ("VLLM::", "vllm.entrypoints", "vllm serve", "sglang.launch_server", "autotune_sim")


@dataclass(frozen=True)
class Leftover:
    """An engine process group that was still alive, with what its processes were."""

    pgid: int
    pids: tuple[int, ...]
    cmdlines: tuple[str, ...]


def looks_like_engine(pid: int) -> bool:
    """Whether process ``pid`` was launched by autotune or runs an engine command line."""
    if environ_value(pid, ENGINE_MARKER_ENV) is not None:
        return True
    cmdline = read_cmdline(pid)
    return any(marker in cmdline for marker in ENGINE_CMDLINE_MARKERS)


def find_leftovers(pgids: Iterable[int]) -> list[Leftover]:
    """The groups among ``pgids`` that still hold a process that looks like an engine.

    The caller's own process group and group 0/1 are never reported.
    """
    protected = {0, 1, os.getpgrp()}
    found = []
    for pgid in dict.fromkeys(pgids):  # keep order, drop repeats
        if pgid in protected:
            continue
        pids = pids_in_group(pgid)
        if not pids:
            continue
        if not any(looks_like_engine(pid) for pid in pids):
            log.info("process group %d is alive but runs no engine (its ID was reused); left alone", pgid)
            continue
        found.append(Leftover(pgid, tuple(pids), tuple(read_cmdline(pid) for pid in pids)))
    return found


def reap_process_groups(pgids: Iterable[int], *, grace_s: float = 5.0) -> list[Leftover]:
    """SIGTERM, then SIGKILL, every leftover engine group among ``pgids``.

    Returns:
        The groups that were found alive and ended (empty when nothing was left).

    Raises:
        TeardownError: Naming the PIDs that survived SIGKILL, after every group was tried.
    """
    leftovers = find_leftovers(pgids)
    survivors: list[int] = []
    for leftover in leftovers:
        log.warning(
            "ending leftover engine group %d (pids %s) from a previous run",
            leftover.pgid,
            ", ".join(map(str, leftover.pids)),
        )
        survivors += terminate_group(leftover.pgid, grace_s=grace_s)
    if survivors:
        raise TeardownError(
            f"leftover engine processes {', '.join(map(str, survivors))} survived SIGKILL; "
            "end them by hand (they may be stuck in the kernel) before starting trials"
        )
    return leftovers
