"""EngineProcess against small fake engines: readiness, fatal lines, crashes, and teardown on every path."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.errors import EngineCrashed, EngineStartupError, StartupTimeout, TeardownError
from autotune.runtime import process as process_module
from autotune.runtime.process import EngineProcess
from autotune.runtime.procfs import ENGINE_MARKER_ENV, environ_value, pids_in_group

MakeEngine = Callable[..., EngineProcess]


def _gone(engine: EngineProcess) -> bool:
    assert engine.pgid is not None
    return pids_in_group(engine.pgid) == []


def _wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.sim
def test_ready_after_health_answers_and_stop_leaves_nothing(make_engine: MakeEngine) -> None:
    engine = make_engine("--print", "hello from the engine", "--ready-after", "0.5", serve=True)
    with engine:
        elapsed = engine.wait_ready()
        assert elapsed >= 0.5
        assert engine.alive and engine.returncode is None
        assert engine.pgid == engine.pid  # a new session leads its own group
    assert _gone(engine)
    assert not engine.alive and engine.returncode is not None
    assert "hello from the engine" in engine.log_path.read_text()


@pytest.mark.sim
def test_environment_is_merged_and_marked(make_engine: MakeEngine) -> None:
    engine = make_engine(serve=True)
    engine.env = {"AUTOTUNE_TEST_VALUE": "42"}
    with engine:
        engine.wait_ready()
        assert engine.pid is not None
        assert environ_value(engine.pid, "AUTOTUNE_TEST_VALUE") == "42"
        assert environ_value(engine.pid, ENGINE_MARKER_ENV) == str(os.getpid())
        assert environ_value(engine.pid, "PATH") == os.environ["PATH"]


@pytest.mark.sim
def test_exit_before_ready_raises_at_once_with_code(make_engine: MakeEngine) -> None:
    engine = make_engine("--exit", "3", startup_timeout_s=120.0)
    with engine, pytest.raises(EngineStartupError) as info:
        engine.wait_ready()
    assert info.value.returncode == 3
    assert info.value.log_path == engine.log_path
    message = str(info.value)
    assert "code 3" in message and str(engine.log_path) in message and "\n" not in message
    assert engine.elapsed_s() < 60  # far from the 120 s deadline


@pytest.mark.sim
def test_fatal_line_ends_the_wait_while_the_engine_still_runs(make_engine: MakeEngine) -> None:
    seen: list[str] = []

    def on_line(line: str) -> bool:
        seen.append(line)
        return line.startswith("FATAL")

    # --ignore-term: like vLLM after a failed start, the fake would take its time to go; the
    # supervisor must not wait for it (SIGKILL after a short SIGTERM grace).
    engine = make_engine(
        "--print", "FATAL: no memory", "--ignore-term", on_line=on_line, startup_timeout_s=120.0, fatal_exit_wait_s=0.2
    )
    with engine:
        with pytest.raises(EngineStartupError) as info:
            engine.wait_ready()
        # The fake never exits by itself: the line alone ended the wait, and the group was
        # ended before the error was raised, not later by stop().
        assert _gone(engine)
    assert "FATAL: no memory" in str(info.value) and "killed after its fatal line" in str(info.value)
    assert info.value.returncode is None  # not the engine's own exit code: we killed it
    assert engine.fatal_line == "FATAL: no memory"
    assert seen[0] == "FATAL: no memory"
    assert engine.elapsed_s() < 60
    assert _gone(engine)


@pytest.mark.sim
def test_fatal_path_kill_removes_the_engines_shared_memory(make_engine: MakeEngine) -> None:
    # Killing after a fatal line must not cost the box RAM: vLLM-CPU leaves ~400 MB in /dev/shm
    # when SIGKILLed, which an overnight run of failed starts would pile up.
    shm = Path(f"/dev/shm/autotune-test-fatal-{time.monotonic_ns()}")
    engine = make_engine(
        "--shm", shm.name, "--print", "FATAL: no memory", "--ignore-term",
        on_line=lambda line: line.startswith("FATAL"), fatal_exit_wait_s=0.1,
    )  # fmt: skip
    try:
        with engine, pytest.raises(EngineStartupError):
            engine.wait_ready()
        assert _gone(engine)
        assert not shm.exists()
    finally:
        shm.unlink(missing_ok=True)


@pytest.mark.sim
def test_shared_memory_of_an_engine_killed_by_someone_else_is_removed_at_stop(make_engine: MakeEngine) -> None:
    # The hang watchdog (search/trial.py) and the OOM killer SIGKILL engine processes without
    # going through stop(): the segments seen while the engine started are removed at stop().
    shm = Path(f"/dev/shm/autotune-test-external-{time.monotonic_ns()}")
    engine = make_engine("--shm", shm.name, serve=True)
    try:
        with engine:
            engine.wait_ready()
            assert engine.pgid is not None and shm.exists()
            os.killpg(engine.pgid, signal.SIGKILL)
            assert _wait_for(lambda: _gone(engine))
            assert shm.exists()  # nobody removed it: a SIGKILLed process cannot
        assert not shm.exists()
    finally:
        shm.unlink(missing_ok=True)


@pytest.mark.sim
def test_fatal_line_waits_for_the_exit_code_and_the_last_lines(make_engine: MakeEngine) -> None:
    seen: list[str] = []

    def on_line(line: str) -> bool:
        seen.append(line)
        return "failed to start" in line

    engine = make_engine(
        "--print", "EngineCore failed to start.", "--exit", "1", "--exit-after", "0.3", on_line=on_line
    )
    with engine, pytest.raises(EngineStartupError) as info:
        engine.wait_ready()
    assert info.value.returncode == 1
    assert "exit code 1" in str(info.value)
    assert seen[-1] == "exiting"  # printed after the fatal line, still handed to on_line


@pytest.mark.sim
def test_startup_timeout_when_never_ready(make_engine: MakeEngine) -> None:
    engine = make_engine(startup_timeout_s=1.0)  # runs but never listens
    with engine:
        with pytest.raises(StartupTimeout) as info:
            engine.wait_ready()
        assert engine.alive
    assert "not ready after 1s" in str(info.value)
    assert _gone(engine)


@pytest.mark.sim
def test_stop_kills_an_orphaned_grandchild_that_ignores_sigterm(make_engine: MakeEngine) -> None:
    engine = make_engine("--orphan", "--ignore-term", serve=True, grace_s=0.5)
    with engine:
        engine.wait_ready()
        assert engine.pgid is not None
        members = pids_in_group(engine.pgid)
        orphans = [pid for pid in members if pid != engine.pid]
        assert orphans, "the fake should have left a grandchild in the group"
        assert engine.group_pids() == members
        started = time.monotonic()
    assert _gone(engine)
    assert engine.stopped_pids == members  # what a caller hands to gpu.wait_pids_released
    assert time.monotonic() - started < 15  # SIGKILL after the 0.5 s grace, not a hang
    for pid in orphans:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]


@pytest.mark.sim
def test_leader_killed_alone_leaves_group_that_stop_still_ends(make_engine: MakeEngine) -> None:
    # vLLM's EngineCore survives a SIGKILL of the API server; the group scan must still find it.
    engine = make_engine("--orphan", serve=True, health_url=None)
    with engine:
        engine.wait_ready()
        assert engine.pid is not None and engine.pgid is not None
        os.kill(engine.pid, signal.SIGKILL)
        assert _wait_for(lambda: not engine.alive)
        with pytest.raises(EngineCrashed, match=r"exited \(killed by SIGKILL, code -9\) after it was ready"):
            engine.check_alive()
        assert pids_in_group(engine.pgid), "the orphan outlives the leader"
    assert _gone(engine)


@pytest.mark.sim
def test_exception_inside_with_still_tears_down(make_engine: MakeEngine) -> None:
    engine = make_engine("--orphan", serve=True)
    with pytest.raises(ValueError, match="benchmark blew up"), engine:
        engine.wait_ready()
        raise ValueError("benchmark blew up")
    assert _gone(engine)


@pytest.mark.sim
def test_keyboard_interrupt_inside_with_still_tears_down(make_engine: MakeEngine) -> None:
    engine = make_engine("--orphan", "--ignore-term", serve=True, grace_s=0.3)
    with pytest.raises(KeyboardInterrupt), engine:
        engine.wait_ready()
        raise KeyboardInterrupt
    assert _gone(engine)


@pytest.mark.sim
def test_check_alive_reports_503_and_exit_code_zero(make_engine: MakeEngine, tmp_path: Path) -> None:
    control = tmp_path / "control"
    engine = make_engine("--control", str(control), serve=True)
    engine.health_url = engine.ready_url
    with engine:
        engine.wait_ready()
        engine.check_alive()  # healthy: no error
        control.write_text("503")
        with pytest.raises(EngineCrashed, match="answered 503"):
            engine.check_alive()
        control.write_text("exit")  # the next health request answers 200, then the fake exits 0
        engine.check_alive()
        assert _wait_for(lambda: not engine.alive)
        with pytest.raises(EngineCrashed, match=r"exited \(code 0\)"):
            engine.check_alive()


@pytest.mark.sim
def test_a_probe_refused_by_a_dying_engine_reports_how_it_died(make_engine: MakeEngine, tmp_path: Path) -> None:
    # The engine is killed between the exit check and the health probe: the refused probe is only
    # a symptom, and the kill (its exit status, a moment later) is the reason recorded.
    control = tmp_path / "control"
    engine = make_engine("--control", str(control), serve=True)
    engine.health_url = engine.ready_url
    with engine:
        engine.wait_ready()
        control.write_text("die")
        with pytest.raises(EngineCrashed, match=r"exited \(killed by SIGKILL, code -9\) after it was ready"):
            engine.check_alive()


@pytest.mark.sim
def test_reader_keeps_draining_when_on_line_raises(make_engine: MakeEngine) -> None:
    def on_line(line: str) -> bool:
        raise RuntimeError("handler bug")

    # 3000 lines ≈ 200 KB: more than a pipe buffer, so a stalled reader would block the fake.
    engine = make_engine("--lines", "3000", serve=True, on_line=on_line)
    with engine:
        engine.wait_ready()
    assert "filler line 2999" in engine.log_path.read_text()


@pytest.mark.sim
def test_stop_before_start_and_twice_is_harmless(make_engine: MakeEngine) -> None:
    engine = make_engine(serve=True)
    engine.stop()
    engine.start()
    engine.wait_ready()
    engine.stop()
    engine.stop()
    assert _gone(engine)


@pytest.mark.sim
def test_start_twice_is_refused(make_engine: MakeEngine) -> None:
    engine = make_engine(serve=True)
    with engine, pytest.raises(RuntimeError, match="called twice"):
        engine.start()


@pytest.mark.sim
def test_missing_command_is_a_startup_error(tmp_path: Path) -> None:
    engine = EngineProcess(["/nonexistent/python"], {}, tmp_path / "e.log", ready_url="http://127.0.0.1:1/health")
    with pytest.raises(EngineStartupError, match="cannot run '/nonexistent/python'"):
        engine.start()
    engine.stop()


def test_wait_ready_before_start_is_a_usage_error(tmp_path: Path) -> None:
    engine = EngineProcess([sys.executable], {}, tmp_path / "e.log", ready_url="http://127.0.0.1:1/health")
    with pytest.raises(RuntimeError, match="not started"):
        engine.wait_ready()


@pytest.mark.sim
def test_survivors_raise_teardown_error_naming_pids(make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = make_engine(serve=True)
    engine.start()
    engine.wait_ready()
    real_terminate = process_module.terminate_group

    def leaky(pgid: int, **kwargs: float) -> list[int]:
        real_terminate(pgid, **kwargs)
        return [424242]  # as if a process in state D survived SIGKILL

    monkeypatch.setattr(process_module, "terminate_group", leaky)
    with pytest.raises(TeardownError, match="424242"):
        engine.stop()


@pytest.mark.sim
def test_teardown_error_does_not_hide_the_error_that_ended_the_block(
    make_engine: MakeEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = make_engine(serve=True)
    real_terminate = process_module.terminate_group

    def leaky(pgid: int, **kwargs: float) -> list[int]:
        real_terminate(pgid, **kwargs)
        return [424242]

    monkeypatch.setattr(process_module, "terminate_group", leaky)
    with pytest.raises(ValueError, match="original"), engine:
        raise ValueError("original")
