"""What other processes took of the engine's cores during a run, read from /proc: a stranger on
the engine's core is seen and judged; the engine alone on it is not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from autotune.runtime.fakegpu import FOREIGN_PID
from autotune.runtime.gpu import FAKE_GPUS_ENV
from autotune.runtime.hostshare import DISTURBED_SHARE, CoreShare, disturbance, gpu_strangers, visible_devices
from autotune.runtime.procfs import terminate_group

BUSY = "while True: pass"


def test_a_share_above_the_limit_is_a_disturbance_that_names_the_cores() -> None:
    quiet = {"host": {"engine_cpus": "0", "engine_share": 0.97, "others_share": 0.03, "stolen_share": 0.0}}
    assert disturbance(quiet) == "" and disturbance({}) == ""
    busy = {"host": {"engine_cpus": "0", "engine_share": 0.52, "others_share": 0.48, "stolen_share": 0.2}}
    line = disturbance(busy)
    assert line.startswith("other processes took 48% of the engine's core(s) 0 during the run, 20% of it stolen")
    assert f"more than {DISTURBED_SHARE:.0%}" in line


@contextmanager
def _busy_on(core: int) -> Iterator[int]:
    """A busy loop pinned to ``core``, in its own process group (its pgid is yielded)."""
    proc = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", BUSY], start_new_session=True)
    try:
        time.sleep(0.3)  # past the interpreter's start
        yield proc.pid
    finally:
        terminate_group(proc.pid, grace_s=1.0)
        proc.wait()


def _measure(core: int, engine_pgid: int, seconds: float = 2.0) -> dict[str, float]:
    share = CoreShare((core,), engine_pgid)
    share.start(time.monotonic())
    time.sleep(seconds)
    measured = share.stop(time.monotonic())
    assert measured is not None
    return measured


@pytest.mark.sim
@pytest.mark.alone  # the host to itself: another test on the same core would be a stranger
def test_a_stranger_on_the_engines_core_is_seen_and_the_engine_alone_is_not() -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2 or shutil.which("taskset") is None or not os.path.isdir("/proc"):
        pytest.skip("needs 2 cores, taskset and /proc (the CPU partition needs them too)")
    core = cores[-1]
    with _busy_on(core) as engine:
        alone = _measure(core, engine)
        with _busy_on(core):
            shared = _measure(core, engine)
    assert alone["engine_share"] > 0.8 and alone["others_share"] < DISTURBED_SHARE, alone
    assert disturbance({"host": alone}) == ""
    assert 0.3 < shared["engine_share"] < 0.7 and shared["others_share"] > 0.3, shared
    assert disturbance({"host": shared}).startswith("other processes took")


def test_a_process_this_study_did_not_start_on_the_engines_gpu_is_a_stranger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Pretend GPU 1 is held by a foreign process; the engine (this test's own group) holds none."""
    monkeypatch.setenv(FAKE_GPUS_ENV, "2xH100-80GB;busy=1;box=hostshare")
    own = os.getpgrp()
    assert gpu_strangers([0], own) == {}
    assert gpu_strangers([1], own) == {"1": [FOREIGN_PID]}
    assert gpu_strangers(visible_devices({}), own) == {"1": [FOREIGN_PID]}  # every device it can see
    assert visible_devices({"CUDA_VISIBLE_DEVICES": "0"}) == [0]
    line = disturbance({"host": {"gpu_strangers": {"1": [FOREIGN_PID]}}})
    assert f"used the engine's GPUs during the run (GPU 1: PID {FOREIGN_PID})" in line
