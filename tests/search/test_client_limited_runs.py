"""A run the client limited is never scored: it is run again, and a trial whose every attempt
was limited ends ``client_limited`` (retried, neither a score nor an SLO violation)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from optuna.trial import TrialState
from test_tune_sim import SEARCH_SPACE, _job
from typer.testing import CliRunner

import autotune.search.trial as trial_module
from autotune.bench.loadgen import run_workload_sync
from autotune.bench.result import BenchResult
from autotune.cli import app
from autotune.engines import get_adapter
from autotune.outcomes import Outcome
from autotune.search.diagnosis import client_problem
from autotune.search.progress import NullProgress
from autotune.search.storage import load_study
from autotune.search.trial import CLIENT_RERUNS, TrialSpec, run_trial
from autotune.search.tune import run_study

pytestmark = pytest.mark.slow

STARVED = "p99 event-loop lag 8979.0 ms (timestamps are late by that much; tolerance 50 ms)"


def _starve_first(monkeypatch: pytest.MonkeyPatch, n: int) -> list[bool]:
    """The first ``n`` runs report a starved client (as a stalled event loop would)."""
    calls: list[bool] = []

    def measured(*args: Any, **kwargs: Any) -> BenchResult:
        result = run_workload_sync(*args, **kwargs)
        starved = len(calls) < n
        calls.append(starved)
        if starved:
            check = dataclasses.replace(result.client, limited=True, reason=STARVED)
            result = dataclasses.replace(result, client=check)
        return result

    monkeypatch.setattr(trial_module, "run_workload_sync", measured)
    return calls


@pytest.mark.sim
def test_a_starved_run_is_run_again_and_only_the_clean_run_is_scored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _starve_first(monkeypatch, 1)
    job = _job(tmp_path, SEARCH_SPACE, method="search", trials=1, finalists=0, baseline=False)
    run_study(job)
    study = load_study("t", job.storage_url)
    (t,) = study.trials
    assert calls == [True, False]
    assert t.state == TrialState.COMPLETE and t.user_attrs["outcome"] == "ok"
    reruns = t.user_attrs["facts"]["client_reruns"]
    assert reruns == [{"repeat": 0, "attempt": 0, "reason": STARVED}]
    assert t.user_attrs["facts"]["client_limited"] is False  # the scored run was not limited
    # `autotune status` says which run was re-run and why, in the trial's row
    # A pipe with no width given keeps each row on one line (xdist's workers export COLUMNS=80).
    shown = CliRunner(env={"COLUMNS": None}).invoke(app, ["status", "t", "--results", str(tmp_path)])
    assert "1 run(s) re-run, client-limited: p99 event-loop lag 8979.0 ms" in shown.output, shown.output


@pytest.mark.sim
def test_a_trial_whose_every_run_was_limited_is_client_limited_never_scored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _starve_first(monkeypatch, 100)
    job = _job(tmp_path, SEARCH_SPACE, method="search", trials=1, finalists=0, baseline=False, retries=1)
    run_study(job)
    study = load_study("t", job.storage_url)
    outcomes = [t.user_attrs["outcome"] for t in study.trials]
    assert outcomes == ["client_limited", "client_limited"]  # the trial and its one retry
    for t in study.trials:
        assert t.state == TrialState.FAIL and t.values is None
        assert len(t.user_attrs["facts"]["client_reruns"]) == CLIENT_RERUNS + 1
        assert STARVED in t.user_attrs["reason"]
    assert study.trials[1].user_attrs["retry_of"] == 0


@pytest.mark.parametrize(
    ("run", "problem"),
    [
        ({"client_limited": False, "failed_client": 0}, ""),
        ({"client_limited": True, "client_limited_reason": "starved"}, "starved"),
        ({"failed_client": 3, "client_error_samples": {"Broken pipe": 3}}, "3 request(s) failed on the client's side"),
        ({"failed_engine": 5, "failed_client": 0}, ""),  # the engine's own failures are measurements
    ],
)
def test_client_problem_names_what_made_the_run_invalid(run: dict[str, Any], problem: str) -> None:
    assert client_problem(run).startswith(problem)
    assert bool(client_problem(run)) == bool(problem)


DISTURBED = "other processes took 35% of the engine's core(s) 0 during the run (more than 10%): the host was measured"


@pytest.mark.sim
def test_a_run_the_host_disturbed_is_run_again_and_a_trial_disturbed_every_time_is_never_scored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host's verdict comes from the engine's cores (runtime/hostshare.py); here it says
    "disturbed" for every run of a trial that is judged for it."""
    judged: list[dict[str, Any]] = []

    def disturbed(run: dict[str, Any]) -> str:
        judged.append(run)
        return DISTURBED

    monkeypatch.setattr(trial_module, "disturbance", disturbed)
    job = _job(tmp_path, SEARCH_SPACE, method="search", trials=1, finalists=0, baseline=False)
    adapter = get_adapter(job.engine)
    spec = TrialSpec(0, "search", adapter.to_flags({}), tmp_path / "0", judge_host=True)
    result = run_trial(spec, adapter, job.workload, NullProgress())
    assert len(judged) == CLIENT_RERUNS + 1
    assert result.outcome == Outcome.HOST_DISTURBED and result.outcome.retryable and not result.outcome.served
    reason = result.reason or ""
    assert reason.startswith("host-disturbed in all") and DISTURBED in reason
    assert [r["reason"] for r in result.facts["client_reruns"]] == [DISTURBED] * (CLIENT_RERUNS + 1)


@pytest.mark.sim
def test_a_simulated_engine_is_never_judged_for_its_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its runs are timed in modelled time, which a busy host does not change."""
    monkeypatch.setattr(trial_module, "disturbance", lambda run: DISTURBED)
    job = _job(tmp_path, SEARCH_SPACE, method="search", trials=1, finalists=0, baseline=False, retries=0)
    run_study(job)
    (t,) = load_study("t", job.storage_url).trials
    assert t.user_attrs["outcome"] == "ok"
