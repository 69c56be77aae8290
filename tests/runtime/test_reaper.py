"""Reaping engine groups left by a killed tuner, and leaving unrelated groups alone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.errors import TeardownError
from autotune.runtime import reaper
from autotune.runtime.procfs import ENGINE_MARKER_ENV, pids_in_group, read_cmdline
from autotune.runtime.reaper import find_leftovers, looks_like_engine, reap_process_groups

pytestmark = pytest.mark.sim

FAKE_ENGINE = Path(__file__).with_name("fake_engine.py")


def fake_argv(*options: str) -> list[str]:
    return [sys.executable, str(FAKE_ENGINE), *options]


@pytest.fixture
def groups() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if pids_in_group(proc.pid):
            os.killpg(proc.pid, 9)
        proc.wait()


def _spawn(groups: list[subprocess.Popen[bytes]], argv: list[str], marked: bool) -> int:
    env = dict(os.environ)
    env.pop(ENGINE_MARKER_ENV, None)
    if marked:
        env[ENGINE_MARKER_ENV] = "12345"
    proc = subprocess.Popen(argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    groups.append(proc)
    # Popen can return while the kernel is still filling in the new program's arguments.
    deadline = time.monotonic() + 10
    while not read_cmdline(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc.pid


def test_marked_group_with_an_orphan_and_sigterm_ignored_is_reaped(groups: list[subprocess.Popen[bytes]]) -> None:
    pgid = _spawn(groups, fake_argv("--orphan", "--ignore-term"), marked=True)
    assert _wait_members(pgid, 2)
    reaped = reap_process_groups([pgid, pgid], grace_s=0.3)
    assert [leftover.pgid for leftover in reaped] == [pgid]
    assert len(reaped[0].pids) == 2
    assert any("fake_engine.py" in cmd for cmd in reaped[0].cmdlines)
    assert pids_in_group(pgid) == []


def test_unmarked_group_with_an_engine_command_line_is_reaped(groups: list[subprocess.Popen[bytes]]) -> None:
    # A renamed child as vLLM's EngineCore: recognised by its command line alone.
    argv = [sys.executable, "-c", "import time; time.sleep(30)", "VLLM::EngineCore"]
    pgid = _spawn(groups, argv, marked=False)
    assert looks_like_engine(pgid)
    assert [leftover.pgid for leftover in reap_process_groups([pgid])] == [pgid]
    assert pids_in_group(pgid) == []


def test_reused_group_id_running_something_else_is_left_alone(groups: list[subprocess.Popen[bytes]]) -> None:
    pgid = _spawn(groups, [sys.executable, "-c", "import time; time.sleep(30)"], marked=False)
    assert not looks_like_engine(pgid)
    assert reap_process_groups([pgid]) == []
    assert pids_in_group(pgid) == [pgid]


def test_dead_and_own_groups_are_skipped() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    done.wait()
    assert find_leftovers([done.pid, os.getpgrp(), 0, 1]) == []


def test_survivors_raise_teardown_error(groups: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    pgid = _spawn(groups, fake_argv(), marked=True)
    monkeypatch.setattr(reaper, "terminate_group", lambda pgid, grace_s: [777001])
    with pytest.raises(TeardownError, match="777001"):
        reap_process_groups([pgid])


def _wait_members(pgid: int, count: int) -> bool:
    deadline = time.monotonic() + 10
    while len(pids_in_group(pgid)) < count:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
