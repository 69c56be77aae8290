"""Early stop of a benchmark run that cannot matter (autotune/bench/earlystop.py).

The bounds are checked against numpy's own statistics (a bound that claims a lost SLO must be
right for every way the rest of the run could go, and tight where it says it is); the sim tests
run real trials: a bad candidate ends early, a validation run never does, and an engine killed
or frozen mid-run ends the run as ``server_dead`` long before any request timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from optuna.trial import TrialState
from simstudy import sim_engine, sim_job

from autotune.bench.earlystop import (
    CANNOT_WIN,
    MIN_REQUESTS,
    REASONS,
    SERVER_DEAD,
    SLO_LOST,
    EarlyStop,
    EarlyStopPolicy,
    percentile_lost,
    throughput_upper_bound,
)
from autotune.bench.loadgen import BenchResult, run_workload
from autotune.bench.metrics import CLIENT, ENGINE, RequestRecord
from autotune.config import StudySettings, Workload, parse_model
from autotune.engines import get_adapter
from autotune.outcomes import Outcome
from autotune.search import stages
from autotune.search.diagnosis import client_problem
from autotune.search.job import TuneJob
from autotune.search.progress import NullProgress
from autotune.search.record import trial_record, trial_records
from autotune.search.runner import StudyRun
from autotune.search.storage import best_trial, feasible_trials, open_study
from autotune.search.trial import TrialSpec, early_stop_policy, run_trial
from autotune.search.tune import make_sampler

BOUND_MS = 1000.0


def _workload(**fields: Any) -> Workload:
    base: dict[str, Any] = {"num_prompts": 100, "arrival": {"concurrency": 10}}
    return parse_model(Workload, {**base, **fields}, "workload")


def _record(
    ttft_s: float = 0.1, *, ok: bool = True, side: str = "", output: int = 10, end: float = 0.0
) -> RequestRecord:
    r = RequestRecord(success=ok, ttft=ttft_s, latency=ttft_s + 0.01 * (output - 1), expected_output_len=output)
    r.output_tokens, r.n_chunks, r.end_time = (output, output, end) if ok else (0, 0, end)
    r.itl = [0.01] * (output - 1) if ok else []
    if not ok:
        r.error, r.failure_side = "failed", side  # type: ignore[assignment]
    return r


def _watch(workload: Workload, planned: int = 100, **policy: Any) -> EarlyStop:
    watch = EarlyStop(EarlyStopPolicy(**policy), workload)
    watch.begin(0.0, [10] * planned)
    return watch


# ------------------------------------------------------------------------ the percentile bound
@pytest.mark.parametrize("p", [50, 90, 95, 99, 99.9])
def test_percentile_bound_is_exact_against_numpy(p: float) -> None:
    """``percentile_lost(k, n, q)`` is true exactly when k values just over the bound, with every
    other value far under it, already put numpy's percentile over the bound: sound for the best
    case the rest of the run could bring, and never later than it must be."""
    over = BOUND_MS * (1 + 1e-9)
    for n in range(1, 120):
        for k in range(n + 1):
            values = [over] * k + [0.0] * (n - k)
            assert percentile_lost(k, n, p / 100) == (np.percentile(values, p) > BOUND_MS), (n, k)


def test_percentile_bound_holds_when_fewer_requests_are_served() -> None:
    """Requests that fail add no value: a bound proven for the planned count holds for fewer."""
    q, n_max = 0.95, 200
    k = next(k for k in range(n_max) if percentile_lost(k, n_max, q))
    assert k == n_max - math.floor((n_max - 1) * q)
    for n in range(k, n_max + 1):
        values = [BOUND_MS + 1] * k + [0.0] * (n - k)
        assert np.percentile(values, 95) > BOUND_MS


def test_p95_ttft_is_lost_at_the_sixth_slow_request_of_a_hundred() -> None:
    watch = _watch(_workload(slos={"p95_ttft_ms": BOUND_MS}))
    for _ in range(5):
        watch.observe(_record(2.0))
    assert watch.tick(1.0, 0) is None  # five of 100 over: the p95 may still come back under
    watch.observe(_record(2.0))
    decision = watch.tick(1.1, 0)
    assert decision is not None and decision.reason == SLO_LOST and decision.at_requests == 6
    assert "p95_ttft_ms: 6 of at most 100" in decision.evidence


def test_mean_and_std_bounds_use_the_planned_count() -> None:
    mean = _watch(_workload(slos={"mean_ttft_ms": BOUND_MS}))
    for _ in range(10):
        mean.observe(_record(10.0))  # 100 s of TTFT over at most 100 requests: mean ≥ 1 s, not above
    assert mean.tick(1.0, 0) is None
    mean.observe(_record(0.5))
    assert (d := mean.tick(1.1, 0)) is not None and d.reason == SLO_LOST

    std = _watch(_workload(slos={"std_ttft_ms": BOUND_MS}))
    for value in (0.0, 20.0) * 5:  # SS = 10 · 100 = 1000 s²: std over 100 values ≥ sqrt(10) s
        std.observe(_record(value))
    assert (d := std.tick(1.0, 0)) is not None and "std_ttft_ms" in d.evidence
    values = [0.0, 20.0] * 5 + [10.0] * 90  # the best the rest can do: every value at the mean
    assert float(np.std(values)) * 1000 > BOUND_MS


def test_tpot_and_itl_bounds() -> None:
    tpot = _watch(_workload(slos={"p90_tpot_ms": BOUND_MS}))
    for _ in range(11):  # 100 − floor(99 · 0.9) = 11 requests decoding at 2 s per token
        tpot.observe(_slow_decode())
    assert (d := tpot.tick(1.0, 0)) is not None and "p90_tpot_ms" in d.evidence

    itl = _watch(_workload(slos={"p50_itl_ms": BOUND_MS}), planned=10)  # at most 10 · 11 gaps
    for _ in range(5):
        itl.observe(_slow_decode())  # 9 slow gaps each: 45 of at most 110 — the median may still pass
    assert itl.tick(1.0, 0) is None
    for _ in range(2):
        itl.observe(_slow_decode())  # 63 of at most 110 − 14 unused = 96 gaps: the median is lost
    assert (d := itl.tick(1.1, 0)) is not None and "p50_itl_ms" in d.evidence


def _slow_decode() -> RequestRecord:
    r = _record(0.1)
    r.itl = [2.0] * 9
    r.latency = r.ttft + sum(r.itl)
    return r


def test_error_rate_counts_only_engine_failures() -> None:
    watch = _watch(_workload(max_error_rate=0.0))
    watch.observe(_record(ok=False, side=CLIENT))
    assert watch.tick(1.0, 0) is None  # the client lost it: no verdict of the engine
    watch.observe(_record(ok=False, side=ENGINE))
    assert (d := watch.tick(1.1, 0)) is not None and d.reason == SLO_LOST and "error_rate" in d.evidence


def test_a_policy_without_slo_lost_never_stops_for_it() -> None:
    watch = _watch(_workload(slos={"p95_ttft_ms": BOUND_MS}), reasons=frozenset({SERVER_DEAD}))
    for _ in range(50):
        watch.observe(_record(5.0))
    assert watch.tick(1.0, 0) is None


# ----------------------------------------------------------------------- the throughput bound
def test_throughput_upper_bound() -> None:
    assert throughput_upper_bound([100.0] * 4) == math.inf  # too few batches to say
    assert throughput_upper_bound([100.0] * 8) == pytest.approx(100.0)
    noisy = [90.0, 110.0] * 4
    upper = throughput_upper_bound(noisy)
    assert upper == pytest.approx(100 + 2.998 * float(np.std(noisy, ddof=1)) / math.sqrt(8))


def _steady_run(watch: EarlyStop, rate: float, seconds: float, requests_per_s: float = 20.0) -> float | None:
    """Feed a run streaming ``rate`` chunks/s and finishing ``requests_per_s``; the time it stopped."""
    now, step = 0.0, 0.1
    while now < seconds:
        now += step
        while watch.completed < int(now * requests_per_s):
            watch.observe(_record(end=now))
        if watch.tick(now, int(rate * now)) is not None:
            return now
    return None


def test_cannot_win_waits_for_steady_state_then_stops_a_clearly_slower_run() -> None:
    workload = _workload(num_prompts=1000)
    stopped = _steady_run(_watch(workload, 1000, incumbent=200.0, noise_margin=0.05), rate=100.0, seconds=30)
    assert stopped is not None
    decision_watch = _watch(workload, 1000, incumbent=200.0, noise_margin=0.05)
    _steady_run(decision_watch, rate=100.0, seconds=30)
    decision = decision_watch.decision
    assert decision is not None and decision.reason == CANNOT_WIN
    assert decision.at_requests >= MIN_REQUESTS
    # steady once the first 10 slots turned over (0.5 s), then 3 s of steady state
    assert stopped >= 0.5 + 3.0


def test_cannot_win_keeps_a_run_within_the_noise_margin() -> None:
    """100 tok/s measured, incumbent 104: within a measured 5 % noise, so the run goes on."""
    watch = _watch(_workload(num_prompts=1000), 1000, incumbent=104.0, noise_margin=0.05)
    assert _steady_run(watch, rate=100.0, seconds=30) is None


def test_cannot_win_allows_for_the_noise_the_study_measured() -> None:
    """Incumbent 115 against 100 tok/s: below it beyond a measured 5 % noise, but within a
    measured 20 % one, where the incumbent's own run may have been that lucky."""
    workload = _workload(num_prompts=1000)
    assert _steady_run(_watch(workload, 1000, incumbent=115.0, noise_margin=0.05), rate=100.0, seconds=30) is not None
    noisy = _watch(workload, 1000, incumbent=115.0, noise_margin=0.20)
    assert _steady_run(noisy, rate=100.0, seconds=30) is None


def test_cannot_win_never_cuts_before_the_noise_is_measured() -> None:
    """Incumbent 200 against 100 tok/s, a run that cannot win by any assumed figure: without a
    measured noise it is not cut (the cut would rest on a number nobody measured)."""
    watch = _watch(_workload(num_prompts=1000), 1000, incumbent=200.0)
    assert _steady_run(watch, rate=100.0, seconds=30) is None


def test_cannot_win_needs_an_incumbent_and_a_throughput_objective() -> None:
    assert _steady_run(_watch(_workload(num_prompts=1000), 1000, noise_margin=0.05), rate=100.0, seconds=30) is None
    latency = _workload(num_prompts=1000, objective={"metric": "p95_ttft_ms", "direction": "minimize"})
    watch = _watch(latency, 1000, incumbent=200.0, noise_margin=0.05)
    assert _steady_run(watch, rate=100.0, seconds=30) is None


def test_server_dead_is_taken_from_outside_the_run() -> None:
    watch = _watch(_workload())
    watch.request_stop(SERVER_DEAD, "engine exited (code -9) mid-run")
    assert (d := watch.tick(1.0, 0)) is not None and d.reason == SERVER_DEAD


# ------------------------------------------------------------------ the load generator's stop
def _fake_server(**fields: Any) -> Any:
    sys.path.insert(0, str(Path(__file__).parent / "bench"))
    from fake_openai import FakeOpenAI  # the load-generator tests' fake server

    return FakeOpenAI(**fields)


def test_a_stopped_run_holds_only_finished_requests_and_no_client_failure() -> None:
    """The engine fails its 30th answer with a bound of no errors: the run stops there, what was
    in flight is cancelled and left out (never counted as a client-side loss that would make the
    tuner discard the run), and the result says why it stopped."""
    fake = _fake_server(token_delay_s=0.002, fail_every=30)
    w = Workload(num_prompts=200, warmup_requests=0, dataset={"input_len": 16, "output_len": 20}, seed=1)
    w = w.model_copy(update={"arrival": w.arrival.model_copy(update={"concurrency": 8})})
    watch = EarlyStop(EarlyStopPolicy(), w)

    async def go() -> BenchResult:
        async with fake.client() as client:
            return await run_workload("http://server:8000", w, client=client, early_stop=watch)

    result = asyncio.run(go())
    run = result.to_json()
    assert run["early_stop"]["reason"] == SLO_LOST and "error_rate" in run["early_stop"]["evidence"]
    assert len(result.records) < 200 and all(r.success or r.failure_side == ENGINE for r in result.records)
    assert run["failed_client"] == 0 and client_problem(run) == ""
    assert run["failed_engine"] == 1 and fake.in_flight == 0
    assert run["stopped_in_flight"] >= 1  # cancelled mid-stream: their tokens count in the throughput only


# ------------------------------------------------------------------------------- the policy
def _settings(**fields: Any) -> StudySettings:
    return parse_model(StudySettings, {"name": "t", **fields}, "study")


def test_policy_never_stops_baseline_validation_probes_or_with_the_option_off() -> None:
    def incumbent() -> float:
        return 123.0

    for stage in ("baseline", "noise", "validation", "memory_edge"):
        assert early_stop_policy(_settings(), stage, False, incumbent, lambda: 0.1) is None
    assert early_stop_policy(_settings(), "search", True, incumbent) is None  # a probe's peak shape
    assert early_stop_policy(_settings(early_stop=False), "search", False, incumbent) is None
    for stage in ("search", "scenario"):  # --method search, and the staged method's search
        unmeasured = early_stop_policy(_settings(), stage, False, incumbent)  # no noise measured yet: no cut
        assert unmeasured is not None and CANNOT_WIN not in unmeasured.reasons and SLO_LOST in unmeasured.reasons
        search = early_stop_policy(_settings(), stage, False, incumbent, lambda: 0.12)
        assert search is not None and search.reasons == REASONS and search.incumbent == 123.0
        assert search.noise_margin == 0.12
    # A configuration cut once runs in full when proposed again.
    again = early_stop_policy(_settings(), "search", False, incumbent, lambda: 0.12, full=True)
    assert again is not None and CANNOT_WIN not in again.reasons
    graph = early_stop_policy(_settings(), "cuda_graph", False, incumbent)
    assert graph is not None and CANNOT_WIN not in graph.reasons and SLO_LOST in graph.reasons
    repeated = early_stop_policy(_settings(repeats=3), "search", False, incumbent)
    assert repeated is not None and repeated.reasons == {SERVER_DEAD}


def test_tune_option_is_stored_with_the_study_config(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    result = CliRunner().invoke(app, ["tune", "--help"], env={"COLUMNS": "200"})
    assert "--no-early-stop" in result.output
    job = _job(tmp_path, early_stop=False)
    assert job.config()["study"]["early_stop"] is False
    assert _job(tmp_path).config()["study"]["early_stop"] is True


# --------------------------------------------------------------------------- on the simulator
# A slow modelled clock: at 5× the client reads ~5× fewer tokens a second than at 20×, so a busy
# 2-core machine does not starve it into client-limited runs.
SPEEDUP = 20
SIM_WORKLOAD = {
    "name": "early-stop",
    "dataset": {"input_len": 512, "output_len": 128},
    "num_prompts": 400,
    "warmup_requests": 2,
    "arrival": {"concurrency": 64},
    "slos": {"p95_ttft_ms": 20000},
}
SPACE = {"params": {"max_running": {"type": "int", "low": 2, "high": 256, "log": True}}}


def _job(tmp_path: Path, **study: Any) -> TuneJob:
    return sim_job(tmp_path, SPACE, engine=sim_engine(speedup=SPEEDUP), workload=SIM_WORKLOAD, **study)


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.parametrize(("slos", "reason"), [({"p95_ttft_ms": 2000}, SLO_LOST), ({}, CANNOT_WIN)])
def test_a_bad_candidate_ends_early_and_never_wins_while_validation_runs_to_its_end(
    tmp_path: Path, slos: dict[str, float], reason: str
) -> None:
    """Two requests at a time out of 64 waiting: its queue breaks the TTFT SLO within the first
    requests; without an SLO its throughput is a fraction of the baseline's, which the run's
    steady state shows long before its end."""
    job = _job(tmp_path, method="search", trials=2, finalists=1, validation_runs=1)
    job = dataclasses.replace(job, workload=job.workload.model_copy(update={"slos": slos}))
    sampler = make_sampler(job.study)
    study = open_study("t", job.storage_url, directions=job.workload.objective.directions, sampler=sampler)
    run = StudyRun(job, get_adapter(job.engine), study, NullProgress())
    stages.baseline(run)
    stages.measure_noise(run)  # the defaults again: without a measured noise nothing is cut
    baseline, again = trial_records(study.trials)
    assert baseline.outcome == again.outcome == "ok", (baseline.reason, again.reason)
    assert baseline.early_stop is None and baseline.metrics["completed"] == 400
    assert run.noise().measured is not None and "trials 0, 1" in run.noise().source

    bad = run.run("search", explicit={"max_running": 2})
    assert bad.outcome.served, (bad.outcome, bad.reason)
    assert bad.early_stop is not None and bad.early_stop["reason"] == reason, bad.early_stop
    assert bad.early_stop["at_requests"] < 400 and bad.metrics["completed"] < 400
    stored = study.trials[2]
    assert trial_record(stored).early_stop == bad.early_stop
    if bad.early_stop["reason"] == CANNOT_WIN:
        assert stored.state == TrialState.PRUNED
    else:
        assert bad.outcome == Outcome.SLO_VIOLATION and stored.state == TrialState.COMPLETE
    assert [t.number for t in feasible_trials(study)] == [0]
    assert stages.finalists(run, 2) == [t for t in study.trials if t.number == 0]
    best = best_trial(study)
    assert best is not None and best.number == 0

    check = run.run("validation", explicit={"max_running": 2}, extra={"validates": 1})
    assert check.outcome.served, (check.outcome, check.reason)
    assert check.early_stop is None and check.metrics["completed"] == 400


def _killer(sig: signal.Signals, after_requests: int) -> tuple[NullProgress, dict[str, float]]:
    """A progress observer that sends ``sig`` to the engine's group once the run served enough."""
    seen: dict[str, float] = {}

    class Killer(NullProgress):
        def bench_progress(self, completed: int, total: int, output_tps: float) -> None:
            if "at" not in seen and completed >= after_requests and "pgid" in seen:
                seen["at"] = time.monotonic()
                os.killpg(int(seen["pgid"]), sig)

    return Killer(), seen


@pytest.mark.sim
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "frozen"])
def test_an_engine_that_dies_mid_run_is_server_dead_at_once(tmp_path: Path, sig: signal.Signals) -> None:
    """Killed: the process exit ends the run within a second or two. Frozen (alive, silent): its
    health route stops answering and no token arrives, so the run ends after three missed checks
    — not after the 120 s stall watchdog or the requests' own timeouts."""
    job = _job(tmp_path)
    progress, seen = _killer(sig, after_requests=40)
    spec = TrialSpec(
        3,
        "search",
        get_adapter(job.engine).to_flags({}),
        tmp_path / "3",
        on_launch=lambda pgid: seen.__setitem__("pgid", pgid),
        early_stop=EarlyStopPolicy(),
    )
    try:
        result = run_trial(spec, get_adapter(job.engine), job.workload, progress)
        ended = time.monotonic()
    finally:
        if sig == signal.SIGSTOP and "pgid" in seen:
            for follow_up in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(int(seen["pgid"]), follow_up)
    assert "at" in seen, "the run ended before the engine could be stopped"
    assert result.outcome == Outcome.CRASH  # no out-of-memory line in the log: a crash, not an OOM
    assert result.early_stop is not None and result.early_stop["reason"] == SERVER_DEAD, result.early_stop
    assert result.early_stop["at_requests"] < 400
    assert result.reason and "root_cause" in result.facts  # classified from the log, as any crash
    # From the kill to the classified result (teardown included): before the 120 s stall watchdog
    # could have ended the run (the reason above already says it did not). A quiet host takes
    # ~2 s killed and ~15 s frozen (the 10 s SIGTERM grace included); a loaded 2-core host
    # stretches both, so the bound is the watchdog's, not the quiet host's.
    assert ended - seen["at"] < 120, result.timings
