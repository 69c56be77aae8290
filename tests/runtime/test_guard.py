"""Engines die with the tuner, whatever kills it (guard.py), and only then.

The tuner here is ``tuner_driver.py``, a subprocess that launches a fake engine from a worker
thread that then ends, exactly as a parallel trial's slot does; the test SIGKILLs it, so no
``finally`` or ``atexit`` of the tuner runs. The requirement is "no process of the engine's
group alive within 5 s of the tuner's death, without a resume"; the group is found by a
``/proc`` scan (the leader, the orphaned grandchild and the watchdog itself).
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autotune.errors import EngineStartupError
from autotune.runtime import guard
from autotune.runtime.process import EngineProcess
from autotune.runtime.procfs import alive, pids_in_group, read_cmdline, send_group

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal and /proc: Linux")

DRIVER = Path(__file__).with_name("tuner_driver.py")
MakeEngine = Callable[..., EngineProcess]
GOAL_S = 5.0  # the requirement: engine gone ≤ 5 s after the tuner died


def _wait_for(predicate: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Callable[..., tuple[subprocess.Popen[str], dict[str, object]]]]:
    """Start tuner drivers; anything of theirs still alive at the end is killed (then the test fails)."""
    started: list[tuple[subprocess.Popen[str], int]] = []

    def start(*options: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
        proc = subprocess.Popen(
            [sys.executable, str(DRIVER), str(tmp_path / f"engine{len(started)}.log"), *options],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the driver prints once its engine is ready
        if not line:
            proc.kill()
            pytest.fail(f"tuner driver exited ({proc.wait()}) before its engine was ready")
        info = json.loads(line)
        started.append((proc, int(info["pgid"])))
        return proc, info

    yield start
    for proc, pgid in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        send_group(pgid, signal.SIGKILL)  # a no-op when the guard did its job


@pytest.mark.sim
@pytest.mark.parametrize(
    "options",
    [(), ("--orphan", "--ignore-term")],
    ids=["engine-obeys-sigterm", "orphan-ignoring-sigterm"],
)
def test_engine_group_is_gone_within_5s_of_a_sigkilled_tuner(
    driver: Callable[..., tuple[subprocess.Popen[str], dict[str, object]]], tmp_path: Path, options: tuple[str, ...]
) -> None:
    # With SIGTERM ignored the watchdog must SIGKILL, and then remove the /dev/shm segment the
    # engine can no longer remove. (An engine that obeys SIGTERM removes its own: the fake does
    # not bother, so the plain case carries none.)
    shm = Path(f"/dev/shm/autotune-test-guard-{time.monotonic_ns()}")
    proc, info = driver(*options, *(("--shm", shm.name) if options else ()))
    pgid = int(str(info["pgid"]))
    members = pids_in_group(pgid)
    assert int(str(info["pid"])) in members
    # The engine outlived the end of the thread that launched it: the parent-death signal
    # follows the tuner process, not the trial thread.
    watchdogs = [pid for pid in members if "guard.py" in read_cmdline(pid)]
    assert len(watchdogs) == 1, f"one watchdog in the engine's group: {[read_cmdline(p) for p in members]}"
    if options:
        assert len(members) == 3  # leader, orphaned grandchild, watchdog

    killed_at = time.monotonic()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    # The watchdog leaves the group to end it, so it is waited for by PID as well.
    gone = _wait_for(lambda: not pids_in_group(pgid) and not alive(watchdogs[0]), GOAL_S)
    took = time.monotonic() - killed_at
    left = {pid: read_cmdline(pid) for pid in [*pids_in_group(pgid), *watchdogs] if alive(pid)}
    assert gone, f"engine processes alive {GOAL_S:.0f}s after the tuner was SIGKILLed: {left}"
    print(f"\nengine group gone {took:.2f}s after SIGKILL of the tuner ({options or 'plain'})")
    log = (tmp_path / "engine0.log").read_text()
    assert f"tuner pid {proc.pid} is gone; ending engine process group {pgid}" in log
    # The watchdog's last word. (0 processes when the parent-death signal was faster.)
    assert re.search(rf"engine group {pgid} \(\d+ processes\) ended", log), log
    if options:  # SIGTERM was ignored: the watchdog had to escalate, and then clean up
        assert "ignored SIGTERM" in log and "sending SIGKILL" in log
        assert f"removed the files it left: {shm}" in log
    exists = shm.exists()
    shm.unlink(missing_ok=True)
    assert not exists, "the killed engine's /dev/shm segment was left behind"


@pytest.mark.sim
def test_engine_launched_from_a_thread_that_ends_keeps_running(make_engine: MakeEngine) -> None:
    # PR_SET_PDEATHSIG fires on the death of the forking *thread*. Trial threads end; engines
    # are forked from one long-lived thread, so this one must live on.
    engine = make_engine(serve=True)
    launcher = threading.Thread(target=lambda: (engine.start(), engine.wait_ready()))
    launcher.start()
    launcher.join()
    assert engine.alive
    # A wrongly armed death signal (SIGTERM) kills the fake within milliseconds; give it ample time.
    assert not _wait_for(lambda: not engine.alive, 1.0), "the engine died with the thread that launched it"
    engine.check_alive()
    engine.stop()
    assert engine.pgid is not None and pids_in_group(engine.pgid) == []


@pytest.mark.sim
def test_normal_stop_ends_the_watchdog_too(make_engine: MakeEngine) -> None:
    engine = make_engine(serve=True)
    with engine:
        engine.wait_ready()
        watchdogs = [pid for pid in engine.group_pids() if "guard.py" in read_cmdline(pid)]
        assert len(watchdogs) == 1 and watchdogs[0] != engine.pid
        assert engine.pid is not None and "fake_engine.py" in read_cmdline(engine.pid)  # exec'd in place
    assert engine.pgid is not None and pids_in_group(engine.pgid) == []
    assert watchdogs[0] in engine.stopped_pids
    assert "tuner pid" not in engine.log_path.read_text()  # the tuner lives: the watchdog never fired


@pytest.mark.sim
def test_engine_exit_code_is_the_engines_own(make_engine: MakeEngine) -> None:
    engine = make_engine("--exit", "3")
    with engine, pytest.raises(EngineStartupError) as info:
        engine.wait_ready()
    assert info.value.returncode == 3  # the guard exec'd the engine: no wrapper exit code in between


@pytest.mark.sim
def test_a_program_that_is_not_executable_is_refused_at_start(tmp_path: Path) -> None:
    script = tmp_path / "engine.sh"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    engine = EngineProcess([str(script)], {}, tmp_path / "e.log", ready_url="http://127.0.0.1:1/health")
    with pytest.raises(EngineStartupError, match="Permission denied"):
        engine.start()
    engine.stop()


def test_guard_usage_error_is_exit_2() -> None:
    assert guard.main(["--tuner", "1"]) == 2


@pytest.mark.sim
def test_parent_death_signal_is_armed_in_the_engine(tmp_path: Path) -> None:
    # A child that sets the signal and reports what the kernel holds (PR_GET_PDEATHSIG = 2).
    code = (
        "import ctypes, signal, sys;"
        f"sys.path.insert(0, {str(Path(guard.__file__).parent)!r});"
        "import guard;"
        "assert guard.set_parent_death_signal(signal.SIGTERM);"
        "libc = ctypes.CDLL(None); v = ctypes.c_int();"
        "libc.prctl(2, ctypes.byref(v), 0, 0, 0); print(v.value)"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == signal.SIGTERM


def test_the_engines_files_are_noted_every_second_through_start_up_then_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The leader dies with the tuner and takes its socket files out of the last scan, so a file
    # made between two notes is lost: through start-up a note every second, then doubling to 30 s.
    clock = [0.0]
    monkeypatch.setattr(guard.time, "monotonic", lambda: clock[0])
    ticks: list[float] = []

    def gone(pid: int, poller: object, start_time: object) -> bool:
        clock[0] += 0.25  # one look at the tuner
        return clock[0] > 400.0

    monkeypatch.setattr(guard, "_gone", gone)
    guard._wait_gone(1, None, None, lambda: ticks.append(clock[0]))
    early = [t for t in ticks if t <= guard._STARTUP_TICKS_S]
    assert len(early) == guard._STARTUP_TICKS_S and all(b - a == 1.0 for a, b in itertools.pairwise(early))
    later = [round(b - a) for a, b in itertools.pairwise(ticks[len(early) - 1 :])]
    assert later == [2, 4, 8, 16, 30, 30, 30, 30, 30, 30]
