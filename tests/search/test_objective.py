"""Scoring: failures never look good; SLO violations are constraints, not hidden values."""

import pytest

from autotune.config import Workload, parse_model
from autotune.errors import ConfigError
from autotune.outcomes import Outcome
from autotune.search.objective import FAILED_VIOLATION, is_feasible, rate_bound_note, score

WL = parse_model(Workload, {"slos": {"p95_ttft_ms": 1000}, "max_error_rate": 0.01}, "t")


def test_served_within_slo_is_feasible() -> None:
    s = score(Outcome.OK, {"output_throughput": 1500.0, "p95_ttft_ms": 800.0, "error_rate": 0.0}, WL)
    assert s.value == 1500.0 and not s.violations
    assert is_feasible("ok", s.constraints)


def test_slo_violation_is_a_positive_constraint() -> None:
    s = score(Outcome.OK, {"output_throughput": 3000.0, "p95_ttft_ms": 1500.0, "error_rate": 0.0}, WL)
    assert s.violations == {"p95_ttft_ms": 0.5}
    assert set(s.constraints) == {"p95_ttft_ms", "error_rate"}
    assert not is_feasible("slo_violation", s.constraints)


def test_error_rate_bound() -> None:
    s = score(Outcome.OK, {"output_throughput": 1.0, "p95_ttft_ms": 1.0, "error_rate": 0.05}, WL)
    assert "error_rate" in s.violations


def test_failed_trial_is_worst_and_infeasible_for_both_directions() -> None:
    s = score(Outcome.OOM_STARTUP, {}, WL)
    assert s.value == 0.0 and all(c == FAILED_VIOLATION for c in s.constraints.values())
    wl_min = parse_model(Workload, {"objective": {"metric": "p95_ttft_ms", "direction": "minimize"}}, "t")
    s_min = score(Outcome.KV_INSUFFICIENT, {}, wl_min)
    # Minimising latency: a failure must score far worse than any real latency (never 0.0).
    assert s_min.value > 1e9
    assert not is_feasible("kv_insufficient", s_min.constraints)


def test_missing_slo_metric_counts_as_violation() -> None:
    s = score(Outcome.OK, {"output_throughput": 10.0}, WL)
    assert s.violations["p95_ttft_ms"] == FAILED_VIOLATION


def test_nan_latency_is_a_violation_not_a_pass() -> None:
    s = score(Outcome.OK, {"output_throughput": 10.0, "p95_ttft_ms": float("nan"), "error_rate": 0.0}, WL)
    assert s.violations["p95_ttft_ms"] == FAILED_VIOLATION


def test_multi_objective_values_and_throughput_floor() -> None:
    wl = parse_model(
        Workload,
        {
            "objective": {
                "metric": "output_throughput",
                "also": [{"metric": "p95_ttft_ms", "direction": "minimize"}],
                "throughput_floor": 1000,
            }
        },
        "t",
    )
    s = score(Outcome.OK, {"output_throughput": 800.0, "p95_ttft_ms": 120.0, "error_rate": 0.0}, wl)
    assert s.values == [800.0, 120.0]
    assert s.violations["throughput_floor"] == 0.2
    failed = score(Outcome.OOM_RUNTIME, {}, wl)
    assert failed.values[0] == 0.0 and failed.values[1] > 1e9


def test_a_start_slower_than_max_startup_s_is_infeasible() -> None:
    wl = parse_model(Workload, {"max_startup_s": 60}, "t")
    served = {"output_throughput": 900.0, "error_rate": 0.0}
    quick, slow = score(Outcome.OK, served, wl, startup_s=45.0), score(Outcome.OK, served, wl, startup_s=90.0)
    assert quick.constraints["startup"] == -0.25 and not quick.violations
    assert slow.violations == {"startup": 0.5} and not is_feasible("slo_violation", slow.constraints)
    assert score(Outcome.OK, served, wl).violations == {"startup": FAILED_VIOLATION}  # not measured: not met
    assert "startup" not in score(Outcome.OK, served, WL, startup_s=900.0).constraints  # no bound: no term


def test_throughput_at_a_set_rate_gets_a_note_and_closed_loops_do_not() -> None:
    paced = parse_model(Workload, {"name": "chat", "arrival": {"request_rate": 8}}, "w")
    note = rate_bound_note(paced)
    assert note is not None and "8 requests/s" in note and "max_slo_rate" in note
    assert rate_bound_note(parse_model(Workload, {"arrival": {"concurrency": 32}}, "w")) is None
    capacity = {"arrival": {"request_rate": 8}, "slos": {"p95_ttft_ms": 500}, "objective": {"metric": "max_slo_rate"}}
    assert rate_bound_note(parse_model(Workload, capacity, "w")) is None
    latency = {"arrival": {"request_rate": 8}, "objective": {"metric": "p95_ttft_ms", "direction": "minimize"}}
    assert rate_bound_note(parse_model(Workload, latency, "w")) is None


def test_max_slo_rate_is_only_maximised() -> None:
    with pytest.raises(ConfigError, match="max_slo_rate is maximised"):
        parse_model(Workload, {"objective": {"metric": "max_slo_rate", "direction": "minimize"}}, "w")
