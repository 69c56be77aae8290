"""The fault matrix (docs/fault-matrix.md): each fault injected into the simulated engine ends in
the documented outcome, leaves no process behind, and leaves the study consistent."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload, parse_model
from autotune.search.storage import load_study
from autotune.search.tune import TuneJob, run_study

pytestmark = pytest.mark.slow

WORKLOAD = {
    "name": "faults",
    "dataset": {"input_len": 256, "output_len": 64},
    "num_prompts": 60,
    "warmup_requests": 0,
    "arrival": {"concurrency": 8},
    "request_timeout_s": 60,
}
SPACE = {"params": {"max_running": {"type": "categorical", "choices": [64]}}}


def _engine(tmp_path: Path, fault: str, startup_timeout_s: float = 60.0, speedup: str = "50") -> EngineSettings:
    env = {"AUTOTUNE_SIM_SPEEDUP": speedup, "AUTOTUNE_SIM_FAULT": fault, "AUTOTUNE_TEST_MARK": str(tmp_path)}
    return parse_model(
        EngineSettings,
        {
            "kind": "vllm",
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "simulated": True,
            "command": [sys.executable, "-m", "autotune.sim", "vllm"],
            "env": env,
            "startup_timeout_s": startup_timeout_s,
        },
        "test",
    )


@pytest.fixture(autouse=True)
def no_engine_outlives_its_test(tmp_path: Path, find_engines: Callable[[str, str], list[int]]) -> Iterator[None]:
    yield
    assert not find_engines("AUTOTUNE_TEST_MARK", str(tmp_path)), "an engine outlived its trial"


def _run(tmp_path: Path, engine: EngineSettings, **study: Any) -> list[optuna.trial.FrozenTrial]:
    job = TuneJob(
        engine=engine,
        space=parse_model(SearchSpace, SPACE, "space"),
        workload=parse_model(Workload, WORKLOAD, "workload"),
        study=parse_model(
            StudySettings,
            {
                "name": "f",
                "results_dir": tmp_path,
                "method": "search",
                "trials": 1,
                "baseline": False,
                "finalists": 0,
                "retries": 0,
                **study,
            },
            "study",
        ),
    )
    run_study(job)
    return load_study("f", job.storage_url).trials


@pytest.mark.parametrize(
    ("fault", "extra", "outcome", "reason_has"),
    [
        ("crash_after_requests=10", {}, "crash", ""),
        ("oom_after_requests=10", {}, "oom_runtime", "out of memory"),
        ("hang_after_requests=10", {"stall_timeout_s": 3}, "crash", "hung"),
        ("drop_connections=0.3", {}, "slo_violation", ""),
        ("slow_startup_s=100", {}, "ok", ""),  # 2 s on the wall at 50×: inside the 60 s timeout
    ],
    ids=["crash-mid-benchmark", "oom-under-load", "hang-mid-benchmark", "connection-drops", "slow-startup-inside"],
)
def test_runtime_faults(tmp_path: Path, fault: str, extra: dict[str, Any], outcome: str, reason_has: str) -> None:
    trials = _run(tmp_path, _engine(tmp_path, fault), **extra)
    assert [t.user_attrs["outcome"] for t in trials] == [outcome]
    assert reason_has.lower() in trials[0].user_attrs["reason"].lower()
    if outcome not in ("ok", "slo_violation"):
        # a failed trial never carries a score that could win
        assert trials[0].state != optuna.trial.TrialState.COMPLETE or trials[0].values[0] == 0.0


def test_hang_at_startup_times_out(tmp_path: Path) -> None:
    trials = _run(tmp_path, _engine(tmp_path, "hang_startup", startup_timeout_s=4))
    assert trials[0].user_attrs["outcome"] == "startup_timeout"
    assert trials[0].state == optuna.trial.TrialState.FAIL  # infrastructure: not told as a value


def test_crash_at_startup_is_a_crash_and_retried_once(tmp_path: Path) -> None:
    # An engine that answers --help like vLLM but segfaults while starting: nothing about the flags.
    wrapper = tmp_path / "engine.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case "$1" in --help*) exec {sys.executable} -m autotune.sim vllm "$@";; esac\n'
        "echo 'Fatal Python error: Segmentation fault' >&2; exit 139\n"
    )
    wrapper.chmod(0o755)
    engine = _engine(tmp_path, "").model_copy(update={"command": [str(wrapper)]})
    trials = _run(tmp_path, engine, retries=1)
    assert [t.user_attrs["outcome"] for t in trials] == ["crash", "crash"]
    assert trials[1].user_attrs["retry_of"] == trials[0].number


def test_port_taken_under_the_engine_is_a_crash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        monkeypatch.setattr("autotune.search.trial.free_port", lambda host: port)
        trials = _run(tmp_path, _engine(tmp_path, ""))
    assert trials[0].user_attrs["outcome"] in ("crash", "startup_timeout")
    assert "address already in use" in Path(trials[0].user_attrs["log_path"]).read_text().lower()


def test_ctrl_c_tears_down_and_resume_finishes(tmp_path: Path, find_engines: Callable[[str, str], list[int]]) -> None:
    wl = tmp_path / "wl.yaml"
    wl.write_text(
        "name: slow\ndataset: {input_len: 256, output_len: 256}\nnum_prompts: 400\narrival: {concurrency: 4}\n"
    )
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  max_running: {type: categorical, choices: [32, 64]}\n")
    cmd = [
        sys.executable,
        "-m",
        "autotune.cli",
        "tune",
        "--study",
        "c",
        "--engine",
        "sim",
        "--method",
        "search",
        "--space",
        str(space),
        "--workload",
        str(wl),
        "--trials",
        "1",
        "--finalists",
        "0",
        "--results",
        str(tmp_path),
        "--sim-speedup",
        "20",
        "--env",
        f"AUTOTUNE_TEST_MARK={tmp_path}",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = tmp_path / "c" / "trials" / "0" / "engine.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and "startup complete" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert find_engines("AUTOTUNE_TEST_MARK", str(tmp_path)), "the engine never started"
    time.sleep(1.0)  # into the benchmark
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "resume" in err
    assert not find_engines("AUTOTUNE_TEST_MARK", str(tmp_path))
    storage = f"sqlite:///{tmp_path / 'c' / 'study.db'}"
    assert load_study("c", storage).trials[0].state == optuna.trial.TrialState.FAIL
    fast = [c if c != "20" else "200" for c in cmd]
    done = subprocess.run(fast, capture_output=True, text=True, timeout=300, env={**os.environ})
    assert done.returncode == 0, done.stderr
    assert not find_engines("AUTOTUNE_TEST_MARK", str(tmp_path))
