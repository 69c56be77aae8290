"""The /proc views used to find every process of an engine's group."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from autotune.runtime.procfs import (
    environ_value,
    group_exists,
    pids_in_group,
    read_cmdline,
    terminate_group,
)


def test_own_group_contains_this_process() -> None:
    assert os.getpid() in pids_in_group(os.getpgrp())
    assert group_exists(os.getpgrp())


def wait_exec_done(pid: int) -> None:
    """Popen can return while the kernel is still filling in the new program's arguments."""
    deadline = time.monotonic() + 10
    while not read_cmdline(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def test_cmdline_and_environ_of_a_child() -> None:
    env = {**os.environ, "AUTOTUNE_PROCFS_TEST": "yes"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env, start_new_session=True)
    try:
        wait_exec_done(child.pid)
        assert "time.sleep(30)" in read_cmdline(child.pid)
        assert environ_value(child.pid, "AUTOTUNE_PROCFS_TEST") == "yes"
        assert environ_value(child.pid, "AUTOTUNE_NOT_SET") is None
        assert pids_in_group(child.pid) == [child.pid]
        assert terminate_group(child.pid, grace_s=5.0) == []
        assert pids_in_group(child.pid) == []
    finally:
        child.kill()
        child.wait()


def test_vanished_process_reads_as_empty() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert read_cmdline(child.pid) == ""
    assert environ_value(child.pid, "PATH") is None
    assert terminate_group(child.pid, grace_s=0.1) == []
