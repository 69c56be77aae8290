"""Supervision of one engine process: start it, wait until it is ready, watch it, kill all of it.

The engine is started in a new session, so it and every process it spawns share one process
group that nothing else uses. Stopping always signals that whole group and then verifies, by a
``/proc`` scan for the group ID, that nothing of it is left: vLLM's EngineCore survives a
SIGKILL of its API server (it is reparented to pid 1), so a child list would miss it.

stdout and stderr go through one pipe into ``log_path`` (vLLM logs on stdout, uvicorn and
tracebacks on stderr; one pipe keeps their order). A reader thread copies each line to the log
and hands it to ``on_line``; a ``True`` from ``on_line`` marks a fatal line, which ends
``wait_ready`` at once instead of at the startup deadline: after a short grace for the lines
around it (the root cause often follows the first fatal line), the group is killed there and
then, rather than waiting for the engine's own shutdown (vLLM-CPU takes 6-13 s after a failed
KV-cache check).

The engine dies with the tuner, however the tuner dies: every engine is started through
``guard.py`` (parent-death signal plus a watchdog in the engine's group that ends the group
when the tuner's PID is gone), and always forked from one long-lived thread, because the
kernel's parent-death signal follows the forking *thread*, not the process.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import queue
import select
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from types import TracebackType
from typing import IO

import httpx

from autotune.errors import EngineCrashed, EngineStartupError, StartupTimeout, TeardownError
from autotune.runtime import guard
from autotune.runtime.procfs import (
    ENGINE_MARKER_ENV,
    engine_files,
    pids_in_group,
    remove_orphaned,
    send_group,
    terminate_group,
)

__all__ = ["EngineProcess", "exit_text"]

log = logging.getLogger(__name__)

_POLL_S = 0.25  # readiness polling interval; a fatal line wakes the poller earlier
_PROBE_TIMEOUT_S = 2.0  # one readiness probe; the server is either listening or refusing
_HEALTH_TIMEOUT_S = 5.0  # a loaded server can answer slowly without being dead
_EXIT_AFTER_REFUSAL_S = 1.0  # a killed process is reaped in moments; a live one refusing is not
_READER_JOIN_S = 2.0  # time for the reader to pass on the last lines after the process exits
_KILL_WAIT_S = 5.0  # after SIGKILL the kernel needs only moments; longer means state D
_FATAL_LINE_CHARS = 200
# After a fatal line and its grace: SIGTERM, this long, then SIGKILL. Short, because the engine
# has already failed and only its shutdown is left to wait for; together with the default 1 s
# grace it keeps "fatal line → classified, group gone" under 2 s.
_FATAL_TERM_S = 0.5
_EXEC_TIMEOUT_S = 60.0  # the guard's Python start and the exec of the engine (seconds on a loaded box)
_FILES_SCAN_S = 1.0  # while starting, how often the group's /dev/shm and socket files are noted
_GUARD = os.path.abspath(guard.__file__)

_LIVE: weakref.WeakSet[EngineProcess] = weakref.WeakSet()


class EngineProcess:
    """One engine launch, as a context manager: ``__enter__`` starts it, ``__exit__`` stops it.

    Args:
        argv: The full command line.
        env: Variables added to (and overriding) the tuner's own environment.
        log_path: Where stdout and stderr go, appended; its folder is created.
        ready_url: Polled by :meth:`wait_ready` until it answers 200 (``ready_url`` then holds
            the route that answered).
        ready_fallback_url: Polled instead once ``ready_url`` answers 404: an engine release
            that does not serve the preferred route.
        ready_check: Polled instead of ``ready_url`` (then None) by a process that serves no
            HTTP, e.g. a daemon that marks itself ready with files; True once ready.
        health_url: Checked by :meth:`check_alive`; None checks only the process.
        on_line: Called with each output line (no newline) from the reader thread; returning
            True marks the line fatal for start-up. Exceptions from it are logged, not raised.
        startup_timeout_s: Deadline for readiness, counted from :meth:`start`.
        grace_s: Time between SIGTERM and SIGKILL in :meth:`stop`.
        fatal_exit_wait_s: After a fatal line, how long :meth:`wait_ready` waits for the
            engine to exit by itself (its exit code and its last lines, often the root cause,
            are then known) before it ends the group itself. Kept ≤ 1 s: fatal line to
            classified outcome with the group gone stays under 2 s.
    """

    def __init__(
        self,
        argv: list[str],
        env: dict[str, str],
        log_path: Path,
        *,
        ready_url: str | None,
        ready_fallback_url: str | None = None,
        ready_check: Callable[[], bool] | None = None,
        health_url: str | None = None,
        on_line: Callable[[str], bool] | None = None,
        startup_timeout_s: float = 600.0,
        grace_s: float = 10.0,
        fatal_exit_wait_s: float = 1.0,
    ):
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.ready_url = ready_url
        self.ready_fallback_url = ready_fallback_url
        self.ready_check = ready_check
        self.health_url = health_url
        self.on_line = on_line
        self.startup_timeout_s = startup_timeout_s
        self.grace_s = grace_s
        self.fatal_exit_wait_s = fatal_exit_wait_s
        self.pid: int | None = None
        self.pgid: int | None = None
        #: the group's PIDs when stop() began: pass them to gpu.wait_pids_released afterwards
        self.stopped_pids: list[int] = []
        self.fatal_line: str | None = None
        #: monotonic time the reader saw the fatal line, and when the group was found gone after it
        self.fatal_at: float | None = None
        self.fatal_ended_at: float | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._fatal = threading.Event()
        # /dev/shm and socket files the engine's processes were seen using (during start-up and once
        # ready): whoever kills a member — the OOM killer, the hang watchdog's SIGKILL — stop()
        # removes those no one uses any more once the group is gone.
        self._files: set[str] = set()
        self._files_noted_at = 0.0
        self._started_at = 0.0

    # ------------------------------------------------------------------------------ lifecycle
    def __enter__(self) -> EngineProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        except TeardownError:
            if exc is None:
                raise
            # Keep the error that ended the block (it explains the trial); the leak is logged.
            log.exception("engine teardown failed while handling %s", exc_type.__name__ if exc_type else "")

    def start(self) -> None:
        """Launch the engine in a new session with its output teed into the log.

        Raises:
            RuntimeError: If this object was already started.
            EngineStartupError: If the command cannot be executed at all.
        """
        if self._proc is not None:
            raise RuntimeError("EngineProcess.start() called twice; create a new EngineProcess per launch")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        # The marker lets a later run recognise this engine if the tuner is killed (reaper.py).
        env = {**os.environ, **self.env, ENGINE_MARKER_ENV: str(os.getpid())}
        # The guard's exec report: close-on-exec in this process, passed to the guard alone.
        status_r, status_w = os.pipe()
        to_close = [status_r, status_w]
        argv = [
            sys.executable, "-I", "-S", _GUARD,
            "--tuner", str(os.getpid()), "--status-fd", str(status_w), "--log", str(self.log_path),
            "--", *self.argv,
        ]  # fmt: skip
        try:
            self._proc = _SPAWNER.popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                pass_fds=(status_w,),
            )
            os.close(to_close.pop())  # our copy of the write end: EOF then means the exec is done
            try:
                failure = _exec_status(status_r, self._proc)
            except BaseException:
                # Interrupted before the engine was ours to stop: never leave it running.
                send_group(self._proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._proc.wait(timeout=_KILL_WAIT_S)
                raise
        except OSError as err:
            self._log.close()
            raise EngineStartupError(
                f"cannot run the engine launcher {sys.executable!r}: {err.strerror}", log_path=self.log_path
            ) from None
        finally:
            for fd in to_close:
                os.close(fd)
        if failure is not None:
            self._proc.wait()
            if self._proc.stdout is not None:
                self._proc.stdout.close()
            self._log.close()
            raise EngineStartupError(
                f"cannot run {self.argv[0]!r}: {failure}; check engine.python / engine.command",
                log_path=self.log_path,
            )
        self._started_at = time.monotonic()
        self.pid = self._proc.pid
        self.pgid = self._proc.pid  # a new session's leader is its group's leader
        _LIVE.add(self)
        self._reader = threading.Thread(target=self._read_output, name=f"engine-log-{self.pid}", daemon=True)
        self._reader.start()
        log.info("engine started: pid %d, log %s", self.pid, self.log_path)

    def stop(self) -> None:
        """SIGTERM the group, SIGKILL it after ``grace_s``, and verify that nothing is left.

        Safe to call more than once and on an engine that never started.

        Raises:
            TeardownError: Naming the PIDs of the group that survived SIGKILL.
        """
        if self._proc is None or self.pgid is None:
            return
        self.stopped_pids = self.group_pids() or self.stopped_pids
        survivors: list[int] = []
        try:
            survivors = terminate_group(self.pgid, grace_s=self.grace_s, kill_wait_s=_KILL_WAIT_S)
        except BaseException:
            # Interrupted while waiting (a second Ctrl-C): never leave the engine running.
            send_group(self.pgid, signal.SIGKILL)
            raise
        finally:
            self._reap_leader()
            self._join_reader(_READER_JOIN_S)
            _LIVE.discard(self)
        if not survivors:
            remove_orphaned(self._files)
        if survivors:
            raise TeardownError(
                f"engine processes {', '.join(map(str, survivors))} (group {self.pgid}) survived SIGKILL; "
                f"kill them by hand before the next launch; see {self.log_path}",
                returncode=self.returncode,
                log_path=self.log_path,
            )

    # ------------------------------------------------------------------------------ state
    @property
    def returncode(self) -> int | None:
        """The exit code of the launched process, or None while it runs (or before start)."""
        return None if self._proc is None else self._proc.poll()

    @property
    def alive(self) -> bool:
        """True while the launched process runs (its children are not looked at)."""
        return self._proc is not None and self._proc.poll() is None

    def group_pids(self) -> list[int]:
        """Live PIDs of the engine's process group (the launched process and all it spawned)."""
        return [] if self.pgid is None else pids_in_group(self.pgid)

    def elapsed_s(self) -> float:
        """Seconds since :meth:`start`."""
        return time.monotonic() - self._started_at

    # ------------------------------------------------------------------------------ readiness
    def wait_ready(self) -> float:
        """Poll ``ready_url`` until it answers 200.

        Returns:
            Seconds from :meth:`start` to the first 200.

        Raises:
            EngineStartupError: At once when the process exits or ``on_line`` flags a fatal line.
            StartupTimeout: When ``startup_timeout_s`` passes first.
        """
        self._require_started()
        deadline = self._started_at + self.startup_timeout_s
        # trust_env=False: a proxy from the environment must not see loopback traffic.
        with httpx.Client(timeout=_PROBE_TIMEOUT_S, trust_env=False) as client:
            while True:
                self._raise_if_start_failed()
                status = self._ready_status(client)
                if status == 404 and self.ready_fallback_url:
                    # This release does not serve the readiness route: decided on its first answer.
                    log.info("%s is not served (404); polling %s instead", self.ready_url, self.ready_fallback_url)
                    self.ready_url, self.ready_fallback_url = self.ready_fallback_url, None
                    continue
                if status == 200:
                    self._note_files()
                    return self.elapsed_s()
                if time.monotonic() - self._files_noted_at >= _FILES_SCAN_S:
                    self._note_files()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StartupTimeout(
                        f"engine not ready after {self.startup_timeout_s:.0f}s (still running); see {self.log_path}",
                        log_path=self.log_path,
                    )
                self._fatal.wait(min(_POLL_S, remaining))

    def _ready_status(self, client: httpx.Client) -> int | None:
        """The readiness route's answer; 200 or None where ``ready_check`` decides."""
        if self.ready_check is not None:
            return 200 if self.ready_check() else None
        return _status(client, self.ready_url) if self.ready_url else None

    def _raise_if_start_failed(self) -> None:
        proc = self._require_started()
        if self._fatal.is_set():
            # A short grace: the engine may exit by itself (argparse exits 2 at once) and the
            # lines around the fatal one — the root cause — reach on_line. Then end the group
            # here rather than wait for the engine's own shutdown: the trial is already lost.
            assert self.fatal_at is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, self.fatal_at + self.fatal_exit_wait_s - time.monotonic()))
            own_code = proc.returncode  # None: still running when the grace ended
            self._end_group_after_fatal()
            self._join_reader(_READER_JOIN_S)
            line = (self.fatal_line or "").strip()[:_FATAL_LINE_CHARS]
            code = f"exit code {own_code}" if own_code is not None else "killed after its fatal line"
            raise EngineStartupError(
                f"engine failed before ready ({code}): {line}; see {self.log_path}",
                returncode=own_code,
                log_path=self.log_path,
            )
        if proc.poll() is not None:
            self._join_reader(_READER_JOIN_S)
            raise EngineStartupError(
                f"engine exited ({exit_text(proc.returncode)}) before ready; see {self.log_path}",
                returncode=proc.returncode,
                log_path=self.log_path,
            )

    # ------------------------------------------------------------------------------ liveness
    def check_alive(self) -> None:
        """Raise EngineCrashed if the engine exited or its health URL reports it dead.

        vLLM exits with code 0 after a runtime engine death, so any exit counts. A health
        probe that times out is not a crash: a saturated server can answer late.

        Raises:
            EngineCrashed: With the exit code or the health status.
        """
        proc = self._require_started()
        self._raise_if_exited(proc)
        if self.health_url is None:
            return
        try:
            status = httpx.get(self.health_url, timeout=_HEALTH_TIMEOUT_S, trust_env=False).status_code
        except httpx.TimeoutException:
            log.warning("health check %s timed out; engine busy, not treated as dead", self.health_url)
            return
        except httpx.HTTPError as err:
            # A refused probe is often a process that is dying (killed between the exit check and
            # the probe): its exit status, if it comes within a moment, is the root cause.
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=_EXIT_AFTER_REFUSAL_S)
            self._raise_if_exited(proc)
            raise EngineCrashed(
                f"engine health check {self.health_url} failed ({type(err).__name__}); see {self.log_path}",
                log_path=self.log_path,
            ) from None
        if status != 200:
            raise EngineCrashed(
                f"engine health check {self.health_url} answered {status}; see {self.log_path}",
                log_path=self.log_path,
            )

    def _raise_if_exited(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is not None:
            raise EngineCrashed(
                f"engine exited ({exit_text(proc.returncode)}) after it was ready; see {self.log_path}",
                returncode=proc.returncode,
                log_path=self.log_path,
            )

    # ------------------------------------------------------------------------------ internals
    def _require_started(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError("EngineProcess not started; call start() or use it as a context manager")
        return self._proc

    def _read_output(self) -> None:
        """Reader thread: copy every line to the log and to ``on_line`` until EOF.

        It must keep draining whatever ``on_line`` does, or a full pipe would block the engine.
        """
        assert self._proc is not None and self._proc.stdout is not None and self._log is not None
        with self._proc.stdout as pipe, self._log as sink:  # the reader owns both and closes them
            for raw in iter(pipe.readline, b""):
                sink.write(raw)
                sink.flush()
                if self.on_line is not None:
                    self._handle_line(raw.decode("utf-8", "replace").rstrip("\r\n"))

    def _handle_line(self, line: str) -> None:
        assert self.on_line is not None
        try:
            fatal = self.on_line(line)
        except Exception:
            log.exception("on_line handler failed on: %s", line[:_FATAL_LINE_CHARS])
            return
        if fatal and not self._fatal.is_set():
            self.fatal_at = time.monotonic()
            self.fatal_line = line
            self._fatal.set()

    def _note_files(self) -> None:
        self._files |= engine_files(self.group_pids())
        self._files_noted_at = time.monotonic()

    def _end_group_after_fatal(self) -> None:
        """SIGTERM the group, SIGKILL it after a moment: what is left after a fatal line is only
        the engine's shutdown. Survivors are left for :meth:`stop`, which names them."""
        assert self.pgid is not None
        self.stopped_pids = self.group_pids() or self.stopped_pids  # for gpu.wait_pids_released
        if not terminate_group(self.pgid, grace_s=_FATAL_TERM_S, kill_wait_s=_KILL_WAIT_S):
            remove_orphaned(self._files)
        self.fatal_ended_at = time.monotonic()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._require_started().wait(timeout=_KILL_WAIT_S)

    def _join_reader(self, timeout_s: float) -> None:
        # EOF needs every writer gone; a process outside the group can hold the pipe, hence the
        # bound. A reader still running then closes the log itself when EOF comes.
        if self._reader is not None and self._reader is not threading.current_thread():
            self._reader.join(timeout_s)

    def _reap_leader(self) -> None:
        """Collect the leader's exit status; kill it by PID if it left its process group."""
        assert self._proc is not None
        try:
            self._proc.wait(timeout=_KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            log.warning("engine pid %d outlived its group's SIGKILL; killing it by pid", self._proc.pid)
            self._proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(timeout=_KILL_WAIT_S)


def exit_text(code: int | None) -> str:
    """``code 1``, or ``killed by SIGKILL, code -9``: a trial's reason names the kill (the OOM
    killer's SIGKILL reads very differently from an exit code the engine chose)."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name}, code {code}"
    return f"code {code}"


def _exec_status(status_r: int, proc: subprocess.Popen[bytes]) -> str | None:
    """Wait for the guard to exec the engine: None once it did (EOF on the close-on-exec status
    pipe), else the reason it could not ("No such file or directory" ...)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + _EXEC_TIMEOUT_S
    while (remaining := deadline - time.monotonic()) > 0:
        ready, _, _ = select.select([status_r], [], [], remaining)
        if not ready:
            continue
        chunk = os.read(status_r, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    else:
        send_group(proc.pid, signal.SIGKILL)
        return f"the engine launcher did not start it within {_EXEC_TIMEOUT_S:.0f}s"
    if chunks:
        return b"".join(chunks).decode("utf-8", "replace").partition(":")[2] or "exec failed"
    return None  # EOF without a word: the exec happened (the engine may already have exited)


class _Spawner:
    """Forks every engine from one long-lived daemon thread.

    ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the child ends, not the process.
    Parallel trials run in worker threads that can end while their engine should live on (and
    in any case the signal must mean "the tuner died"), so no trial thread ever forks an
    engine: this thread does, and it lives as long as the tuner process.
    """

    def __init__(self) -> None:
        self._reset()
        # A forked child (multiprocessing) has no spawner thread, and the lock may have been
        # held at the fork: it starts afresh.
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Future[subprocess.Popen[bytes]], list[str], dict[str, object]]] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None

    def popen(self, argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        future: Future[subprocess.Popen[bytes]] = Future()
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="engine-spawner", daemon=True)
                self._thread.start()
        self._jobs.put((future, argv, kwargs))
        try:
            return future.result()
        except BaseException:
            # Interrupted (Ctrl-C) while the launch was under way: kill whatever it started.
            future.add_done_callback(_kill_abandoned)
            raise

    def _run(self) -> None:
        while True:
            future, argv, kwargs = self._jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(subprocess.Popen(argv, **kwargs))  # type: ignore[call-overload]
            except BaseException as err:
                future.set_exception(err)


def _kill_abandoned(future: Future[subprocess.Popen[bytes]]) -> None:
    if future.exception() is None:
        proc = future.result()
        send_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_KILL_WAIT_S)


_SPAWNER = _Spawner()


def _status(client: httpx.Client, url: str) -> int | None:
    """HTTP status of a GET, or None while nothing answers (loading engines refuse connections)."""
    try:
        return client.get(url).status_code
    except httpx.HTTPError:
        return None


@atexit.register
def _stop_leftovers() -> None:
    """Stop engines still running when the interpreter exits (an exception outside any ``with``)."""
    for engine in list(_LIVE):
        with contextlib.suppress(Exception):
            engine.stop()
