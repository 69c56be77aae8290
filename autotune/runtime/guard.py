"""Launcher and watchdog that tie an engine's life to the tuner's, whatever kills the tuner.

A tuner that dies by SIGKILL (or the OOM killer, or a lost machine session) runs no ``finally``
and no ``atexit``: before this module its engine's API server, EngineCore and workers kept
running, holding the GPU, until a resume reaped them. :class:`~autotune.runtime.process.EngineProcess`
therefore starts every engine through this file, run as a script by the tuner's own Python
(``python -I -S guard.py ...``: standard library only, so it starts in milliseconds and never
imports the engine's or the tuner's packages)::

    guard.py --tuner PID --status-fd FD --log PATH -- ENGINE ARGV...

In the engine's new session (``start_new_session``), before the engine runs, it

1. sets ``PR_SET_PDEATHSIG`` to SIGTERM (Linux; nothing elsewhere), so the kernel tells the
   engine's leader at once when its parent goes. The kernel means the parent *thread*: that is
   why EngineProcess forks every engine from one long-lived thread (``process._Spawner``), never
   from a trial's worker thread, which may end while its engine still runs;
2. checks that its parent is still the tuner (the tuner may have died before step 1 took
   effect) and opens a pidfd on it;
3. forks the **watchdog** (a double fork, so that it is nobody's child — an engine that kills
   its own child processes on shutdown never sees it — but stays in the engine's process group
   and session): it waits until the tuner's PID is gone — the *process*, not the thread that
   launched it — then leaves the group and ends it with ``procfs.terminate_group``: SIGTERM,
   :data:`TERM_GRACE_S`, SIGKILL, and removal of the ``/dev/shm`` segments and socket files the
   killed engine can no longer remove. PDEATHSIG only reaches the leader; vLLM's EngineCore and workers,
   and SGLang's schedulers, are what the watchdog is for;
4. ``exec``\\ s the engine in place (same PID, so the process group and the exit code are the
   engine's). The status pipe is close-on-exec: EOF there tells the tuner the exec worked; an
   ``errno`` written there means it did not.

On a normal stop the tuner's SIGTERM to the group ends the watchdog as well (it keeps the
default SIGTERM action). The reaper on resume (``reaper.py``) stays as the second line, for a
watchdog that was itself killed. What the watchdog did is appended to the engine's log
(``autotune guard: ...``).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["TERM_GRACE_S", "main", "set_parent_death_signal"]

#: After SIGTERM, how long the group may take to exit before SIGKILL. With the ≤ 0.25 s it
#: takes to notice the tuner is gone (pidfd: at once), the engine is gone within ≈ 2.5 s of the
#: tuner's death, inside the 5 s the fault matrix promises.
TERM_GRACE_S = 2.0
_ALIVE_POLL_S = 0.25  # how long one look at the tuner waits
# While the tuner lives, the engine's /dev/shm and socket files are noted every second through
# start-up, when they appear, then at doubling intervals up to 30 s once it serves. A file noted
# late is lost: the leader dies of its parent-death signal with the tuner, before the last scan,
# and its socket files (vLLM's ZMQ paths, made a few seconds into a ~30 s start) go out of sight
# with it; at 1, 2, 4, 8, 16 s ticks a kill between 15 and 31 s into a start missed them.
_FIRST_TICK_S = 1.0
_STARTUP_TICKS_S = 180.0
_MAX_TICK_S = 30.0
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def set_parent_death_signal(sig: int) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` for the calling process; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/<pid>/stat`` (start time in clock ticks): tells a reused PID apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


def _open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux ≥ 5.3, or seccomp forbids it
        return None


def _wait_gone(pid: int, pidfd: int | None, start_time: str | None, tick: Callable[[], None]) -> None:
    """Block until process ``pid`` (the tuner) has exited, calling ``tick`` now and then: every
    :data:`_FIRST_TICK_S` for :data:`_STARTUP_TICKS_S`, then at doubling intervals up to
    :data:`_MAX_TICK_S`."""
    poller = None
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
    started = time.monotonic()
    interval = _FIRST_TICK_S
    next_tick = started + interval
    while not _gone(pid, poller, start_time):
        if (now := time.monotonic()) >= next_tick:
            tick()
            if now - started >= _STARTUP_TICKS_S:
                interval = min(2 * interval, _MAX_TICK_S)
            next_tick = time.monotonic() + interval


def _gone(pid: int, poller: select.poll | None, start_time: str | None) -> bool:
    """Whether the tuner has exited; waits up to :data:`_ALIVE_POLL_S` for it."""
    if poller is not None:
        return bool(poller.poll(_ALIVE_POLL_S * 1000))  # readable once the process has exited
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # exists, though not ours: a reused PID is caught by the start time below
    if start_time is not None and _start_time(pid) != start_time:
        return True
    time.sleep(_ALIVE_POLL_S)
    return False


def _load_procfs() -> Any:
    """``procfs.py`` of this package, loaded by path: this script runs without site-packages and
    must not import the package (its ``__init__`` pulls in httpx and the GPU modules)."""
    spec = importlib.util.spec_from_file_location(
        "_autotune_guard_procfs", os.path.join(os.path.dirname(os.path.abspath(__file__)), "procfs.py")
    )
    if spec is None or spec.loader is None:
        raise ImportError("procfs.py not found next to guard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _note(log_path: str, text: str) -> None:
    """Append one line to the engine's log (the tuner that would have read the pipe is gone)."""
    with contextlib.suppress(OSError), open(log_path, "a") as f:
        f.write(f"autotune guard: {text}\n")


def _watch(tuner: int, pidfd: int | None, start_time: str | None, log_path: str, procfs: Any) -> None:
    """The watchdog's whole life: wait for the tuner to die, then end the engine's group."""
    pgid = os.getpgrp()
    files: set[str] = set()

    def note_files() -> None:
        # Noted while the engine runs: the leader dies of its parent-death signal the moment the
        # tuner does, before the scan below, and takes its socket files out of that scan.
        if procfs is not None:
            files.update(procfs.engine_files(procfs.pids_in_group(pgid)))

    _wait_gone(tuner, pidfd, start_time, note_files)
    _note(log_path, f"tuner pid {tuner} is gone; ending engine process group {pgid}")
    if procfs is None:  # procfs.py could not be loaded: signals only, no file clean-up
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the group's SIGTERM is ours to send
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        time.sleep(TERM_GRACE_S)
        _note(log_path, f"sending SIGKILL to group {pgid}")
        os.killpg(pgid, signal.SIGKILL)  # this process too, last
        return
    # Leave the engine's group (for a group of our own in the same session), so that the group
    # empties and the signals and scans below are about the engine alone.
    os.setpgid(0, 0)
    pids = procfs.pids_in_group(pgid)
    files.update(procfs.engine_files(pids))  # before any signal: a process may unmap while it dies
    procfs.send_group(pgid, signal.SIGTERM)
    if not procfs.wait_group_empty(pgid, TERM_GRACE_S):
        _note(log_path, f"group {pgid} ignored SIGTERM for {TERM_GRACE_S:.0f}s; sending SIGKILL")
        procfs.send_group(pgid, signal.SIGKILL)
        procfs.wait_group_empty(pgid, 5.0)
    survivors = procfs.pids_in_group(pgid)
    removed = [] if survivors else procfs.remove_orphaned(files)
    _note(
        log_path,
        f"engine group {pgid} ({len(pids)} processes) "
        + (f"not ended: pids {survivors} survived SIGKILL" if survivors else "ended")
        + (f"; removed the files it left: {', '.join(removed)}" if removed else ""),
    )


def _spawn_watchdog(tuner: int, pidfd: int | None, start_time: str | None, log_path: str, status_fd: int) -> None:
    """Double fork: the grandchild watches; the child exits at once so nobody waits on it."""
    child = os.fork()
    if child:
        os.waitpid(child, 0)
        return
    try:
        if os.fork():
            os._exit(0)
        # The grandchild: keep nothing the engine's pipe or status need (the tuner's reader waits
        # for EOF on the pipe; the status pipe's EOF means "exec done").
        os.close(status_fd)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        try:
            procfs = _load_procfs()
        except Exception:
            procfs = None
        _watch(tuner, pidfd, start_time, log_path, procfs)
    finally:
        os._exit(0)


def _report(status_fd: int, err: OSError) -> None:
    with contextlib.suppress(OSError):
        os.write(status_fd, f"{err.errno or 0}:{err.strerror or err}".encode())


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        cut = args.index("--")
        opts = dict(zip(args[:cut:2], args[1:cut:2], strict=True))
        tuner, status_fd, log_path = int(opts["--tuner"]), int(opts["--status-fd"]), opts["--log"]
        command = args[cut + 1 :]
        if not command:
            raise ValueError("no engine command")
    except (ValueError, KeyError) as exc:
        print(f"usage: guard.py --tuner PID --status-fd FD --log PATH -- ARGV... ({exc})", file=sys.stderr)
        return 2
    os.set_inheritable(status_fd, False)  # closed by exec: its EOF is the tuner's "started"
    set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != tuner:
        return 1  # the tuner died before the death signal was armed: start nothing
    pidfd = _open_pidfd(tuner)
    if os.getppid() != tuner:
        return 1  # it died while the pidfd was opened: the pidfd may name another process
    start_time = _start_time(tuner)
    try:
        # Fail before forking when the program cannot be found, like subprocess would.
        _resolve(command[0])
    except OSError as err:
        _report(status_fd, err)
        return 127
    _spawn_watchdog(tuner, pidfd, start_time, log_path, status_fd)
    if pidfd is not None:
        os.close(pidfd)
    try:
        os.execvp(command[0], command)
    except OSError as err:
        _report(status_fd, err)
    # exec failed after the watchdog started: end the group (the watchdog and this process).
    os.killpg(os.getpgrp(), signal.SIGKILL)
    return 127


def _resolve(program: str) -> str:
    """The path exec would run for ``program`` (PATH searched), or OSError(ENOENT/EACCES)."""
    path_dirs = os.get_exec_path()
    candidates = [program] if os.sep in program else [os.path.join(d or ".", program) for d in path_dirs]
    denied = False
    for path in candidates:
        if os.path.isfile(path):
            if os.access(path, os.X_OK):
                return path
            denied = True
    code = errno.EACCES if denied else errno.ENOENT
    raise OSError(code, os.strerror(code), program)


if __name__ == "__main__":
    sys.exit(main())
