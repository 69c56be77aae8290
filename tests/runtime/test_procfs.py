"""The /proc views used to find every process of an engine's group."""

from __future__ import annotations

import mmap
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.runtime.procfs import (
    alive,
    environ_value,
    group_exists,
    pids_in_group,
    read_cmdline,
    remove_orphaned,
    shm_files,
    socket_files,
    terminate_group,
)


def test_own_group_contains_this_process() -> None:
    assert os.getpid() in pids_in_group(os.getpgrp())
    assert group_exists(os.getpgrp())
    assert alive(os.getpid())


def wait_exec_done(pid: int) -> None:
    """Popen can return while the kernel is still filling in the new program's arguments."""
    deadline = time.monotonic() + 10
    while not read_cmdline(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.mark.sim
def test_cmdline_and_environ_of_a_child() -> None:
    env = {**os.environ, "AUTOTUNE_PROCFS_TEST": "yes"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env, start_new_session=True)
    try:
        wait_exec_done(child.pid)
        assert "time.sleep(30)" in read_cmdline(child.pid)
        assert environ_value(child.pid, "AUTOTUNE_PROCFS_TEST") == "yes"
        assert environ_value(child.pid, "AUTOTUNE_NOT_SET") is None
        assert pids_in_group(child.pid) == [child.pid]
        assert alive(child.pid)
        assert terminate_group(child.pid, grace_s=5.0) == []
        assert pids_in_group(child.pid) == []
        assert not alive(child.pid)  # a zombie until this test reaps it: not running
    finally:
        child.kill()
        child.wait()


@pytest.mark.sim
def test_vanished_process_reads_as_empty() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert read_cmdline(child.pid) == ""
    assert environ_value(child.pid, "PATH") is None
    assert not alive(child.pid)
    assert terminate_group(child.pid, grace_s=0.1) == []


def _shm_name(tag: str) -> str:
    return f"autotune-test-{tag}-{os.getpid()}-{time.monotonic_ns()}"


@pytest.mark.sim
def test_shared_memory_of_a_killed_group_is_removed_and_in_use_memory_is_kept(tmp_path: Path) -> None:
    # A SIGKILLed engine cannot remove its /dev/shm segments (vLLM-CPU: ~400 MB a launch).
    name = _shm_name("killed")
    ready = tmp_path / "ready"
    code = (
        "import mmap, os, signal, sys, time;"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        f"fd = os.open('/dev/shm/{name}', os.O_CREAT | os.O_RDWR, 0o600); os.ftruncate(fd, 4096);"
        "m = mmap.mmap(fd, 4096); os.close(fd);"
        f"open({str(ready)!r}, 'w').close();"
        "time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    kept = _shm_name("kept")
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert f"/dev/shm/{name}" in shm_files([child.pid])
        # A segment this process maps is in use: never removed, even if named as a candidate.
        fd = os.open(f"/dev/shm/{kept}", os.O_CREAT | os.O_RDWR, 0o600)
        os.ftruncate(fd, 4096)
        held = mmap.mmap(fd, 4096)
        os.close(fd)
        assert remove_orphaned([f"/dev/shm/{kept}"]) == []
        assert terminate_group(child.pid, grace_s=0.2) == []  # SIGTERM ignored: SIGKILL
        assert not Path(f"/dev/shm/{name}").exists()
        assert Path(f"/dev/shm/{kept}").exists()
        held.close()
    finally:
        child.kill()
        child.wait()
        for leftover in (name, kept):
            Path(f"/dev/shm/{leftover}").unlink(missing_ok=True)


@pytest.mark.sim
def test_socket_files_of_an_ended_group_are_removed_and_bound_ones_kept(tmp_path: Path) -> None:
    # vLLM's ZeroMQ ipc:// sockets stay in /tmp after the engine is gone, even on a clean exit.
    path, ready = tmp_path / "engine.sock", tmp_path / "ready"
    code = (
        "import signal, socket, time;"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN);"
        f"s = socket.socket(socket.AF_UNIX); s.bind({str(path)!r}); s.listen();"
        f"open({str(ready)!r}, 'w').close();"
        "time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    kept = tmp_path / "kept.sock"
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert socket_files([child.pid]) == {str(path)}
        with socket.socket(socket.AF_UNIX) as ours:
            ours.bind(str(kept))  # bound by a live socket: in use, never removed
            assert remove_orphaned([str(kept)]) == []
            assert terminate_group(child.pid, grace_s=0.2) == []  # SIGTERM ignored: SIGKILL
            assert not path.exists()
            assert kept.exists()
    finally:
        child.kill()
        child.wait()


def test_only_shared_memory_and_socket_files_are_ever_removed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "not-shm"
    elsewhere.write_text("x")
    assert remove_orphaned([str(elsewhere)]) == []
    assert elsewhere.exists()
