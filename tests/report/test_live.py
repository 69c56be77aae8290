"""The live run's line per trial: a run stopped early is said to be one, with its partial figures."""

from __future__ import annotations

from rich.console import Console

from autotune.config import Workload, parse_model
from autotune.report.live import LiveProgress, shown_metrics


def _finished(summary: dict) -> str:
    console = Console(force_terminal=False, width=400, soft_wrap=True, color_system=None)
    with console.capture() as captured:
        LiveProgress(console).trial_finished(summary)
    return captured.get().strip()


def test_an_early_stopped_trial_says_so_before_its_partial_figures() -> None:
    stop = {"reason": "cannot_win", "at_requests": 121, "evidence": "output_throughput 1,920.4 tok/s over 3.0 s"}
    line = _finished(
        {
            "number": 3,
            "stage": "scenario",
            "outcome": "ok",
            "metrics": {"output_throughput": 1822.7, "p95_ttft_ms": 932.0},
            "early_stop": stop,
            "timings": {"startup_s": 30, "bench_s": 5, "total_s": 35},
        }
    )
    assert line.startswith("trial 3 → ok, stopped early (cannot_win): partial run 1,822.7 tok/s, p95 TTFT 932 ms; ")
    assert "at 121 requests: output_throughput 1,920.4 tok/s over 3.0 s" in line


def test_a_full_run_reads_as_before() -> None:
    line = _finished(
        {
            "number": 2,
            "stage": "scenario",
            "outcome": "ok",
            "metrics": {"output_throughput": 2845.8, "p95_ttft_ms": 108},
        }
    )
    assert line.startswith("trial 2 → ok: 2,845.8 tok/s, p95 TTFT 108 ms (start 0s")


def test_a_goodput_study_under_a_p90_slo_shows_its_objective_and_its_slo() -> None:
    workload = parse_model(
        Workload, {"slos": {"p90_ttft_ms": 150}, "objective": {"metric": "request_goodput"}}, "workload"
    )
    assert shown_metrics(workload) == ("request_goodput", "p90_ttft_ms")
    assert shown_metrics(parse_model(Workload, {}, "workload")) == ("p95_ttft_ms",)
    console = Console(force_terminal=False, width=400, soft_wrap=True, color_system=None)
    summary = {
        "number": 4,
        "stage": "scenario",
        "outcome": "slo_violation",
        "metrics": {"output_throughput": 1531.0, "request_goodput": 12.3, "p90_ttft_ms": 234.4, "p95_ttft_ms": 278},
    }
    with console.capture() as captured:
        LiveProgress(console, shown=shown_metrics(workload)).trial_finished(summary)
    line = captured.get().strip()
    assert line.startswith("trial 4 → slo_violation: 1,531.0 tok/s, goodput 12.3 req/s, p90 TTFT 234 ms (start")


def test_a_predicted_trial_shows_the_twin_and_its_running_median_error() -> None:
    console = Console(force_terminal=False, width=400, soft_wrap=True, color_system=None)
    progress = LiveProgress(console)
    cut = {"output_throughput": 1100.0}
    twins = [
        {"predicted": {"output_throughput": 2000.0}, "error": {"output_throughput": 0.25}},
        {
            "predicted": {"output_throughput": 1500.0},
            "predicted_cut": cut,
            "cut_at": 96,
            "error": {"output_throughput": -0.05},
        },
        {"skipped": "an open-loop request rate is not modelled by the twin (a closed loop of streams is)"},
    ]
    with console.capture() as captured:
        for number, twin in enumerate(twins):
            summary = {"number": number, "stage": "search", "outcome": "ok", "metrics": {"output_throughput": 1000.0}}
            progress.trial_finished({**summary, "twin": twin})
    lines = [line.strip() for line in captured.get().splitlines() if line.strip().startswith("twin")]
    assert lines == [
        "twin 2,000.0 tok/s (+25.0 % off the measured); median |error| 25.0 % over 1 trial(s)",
        "twin 1,500.0 tok/s; 1,100.0 for the 96 requests served before the cut (-5.0 % off the measured); "
        "median |error| 15.0 % over 2 trial(s)",
        "twin: skipped (an open-loop request rate is not modelled by the twin (a closed loop of streams is))",
    ]
