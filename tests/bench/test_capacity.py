"""The capacity search's bracketing, bisection and confirmation, on a modelled server."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from autotune.bench import capacity as capacity_mod
from autotune.bench.capacity import search_capacity
from autotune.config import CapacitySearch, Workload, parse_model
from autotune.errors import ConfigError


@dataclass
class FakeResult:
    metrics: dict[str, Any]
    deadline_hit: bool = False
    client_limited: bool = False

    def to_json(self) -> dict[str, Any]:
        return dict(self.metrics)


@dataclass
class Server:
    """p50 TTFT is 50 ms below the capacity and 900 ms above; TPOT grows with concurrency."""

    capacity: float
    flaky: set[float] = field(default_factory=set)  # levels that fail on their 2nd run
    runs: list[Workload] = field(default_factory=list)

    def measure(self, w: Workload) -> FakeResult:
        self.runs.append(w)
        rate, conc = w.arrival.request_rate, w.arrival.concurrency
        level = conc if conc is not None and math.isinf(rate) else rate
        seen = sum(self._level(r) == level for r in self.runs)
        over = level > self.capacity or (level in self.flaky and seen == 2)
        throughput = min(level, self.capacity) if math.isfinite(level) else self.capacity
        metrics = {
            "p50_ttft_ms": 900.0 if over else 50.0,
            "mean_tpot_ms": 10.0 + (conc or 0),
            "error_rate": 0.0,
            "request_throughput": throughput,
            "num_prompts": w.num_prompts,
        }
        return FakeResult(metrics)

    @staticmethod
    def _level(w: Workload) -> float:
        conc = w.arrival.concurrency
        return float(conc) if conc is not None and math.isinf(w.arrival.request_rate) else w.arrival.request_rate


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Server]:
    def make(capacity: float, flaky: set[float] | None = None) -> Server:
        s = Server(capacity, flaky or set())

        async def fake_run(base_url: str, w: Workload, **kw: Any) -> FakeResult:
            return s.measure(w)

        monkeypatch.setattr(capacity_mod, "run_workload", fake_run)
        return s

    return make


def workload(**capacity: Any) -> Workload:
    spec = {"num_prompts": 50, "slos": {"p50_ttft_ms": 200}, "capacity": capacity}
    return parse_model(Workload, spec, "test")


def test_brackets_bisects_and_confirms_the_edge(server: Callable[..., Server]) -> None:
    s = server(37.0)
    res = search_capacity("http://x", workload(start=10, rel_tol=0.1, max_runs=12))
    assert res.stop_reason == "converged" and res.next_step_failed
    assert res.value <= 37.0 < res.upper <= res.value * 1.1 + 1e-9
    levels = [r.level for r in res.runs]
    assert levels[:3] == [10, 20, 40]  # doubling until the first failure
    assert levels[-1] == levels[-2] == res.value  # the level found ran twice (confirmed)
    assert res.best is not None and res.best.passed
    assert all(w.arrival.concurrency is None for w in s.runs)  # rate levels are open loop


def test_a_level_that_fails_its_confirmation_moves_the_search_down(server: Callable[..., Server]) -> None:
    server(37.0)
    first = search_capacity("http://x", workload(start=10, rel_tol=0.1, max_runs=12))
    server(37.0, flaky={first.value})
    res = search_capacity("http://x", workload(start=10, rel_tol=0.1, max_runs=14))
    assert res.value < first.value and res.upper == first.value and res.next_step_failed


def test_starts_from_a_saturation_run_without_a_rate(server: Callable[..., Server]) -> None:
    s = server(25.0)
    res = search_capacity("http://x", workload(rel_tol=0.2, max_runs=10))
    assert math.isinf(res.runs[0].level) and not res.runs[0].passed
    assert math.isinf(s.runs[0].arrival.request_rate)
    assert res.runs[1].level == 25.0  # the throughput the saturation run reached
    assert res.value <= 25.0 < res.upper


def test_rate_runs_are_sized_by_seconds_per_run(server: Callable[..., Server]) -> None:
    s = server(1000.0)
    search_capacity("http://x", workload(start=4, seconds_per_run=5, max_runs=3, high=16))
    assert [w.num_prompts for w in s.runs] == [20, 40, 80]  # at least 20; rate × 5 s


def test_stops_at_high_and_below_low(server: Callable[..., Server]) -> None:
    server(1e9)
    top = search_capacity("http://x", workload(start=10, high=40))
    assert (top.stop_reason, top.value, top.upper, top.next_step_failed) == ("at_high", 40, None, False)
    server(0.01)
    bottom = search_capacity("http://x", workload(start=1, low=0.25))
    assert (bottom.stop_reason, bottom.value, bottom.upper) == ("below_low", 0.0, 0.25)
    assert [r.level for r in bottom.runs] == [1, 0.5, 0.25]


def test_max_runs_bounds_the_search(server: Callable[..., Server]) -> None:
    server(37.0)
    res = search_capacity("http://x", workload(start=1, max_runs=4))
    assert len(res.runs) == 4 and res.stop_reason == "max_runs" and not res.next_step_failed


def test_concurrency_search_stays_on_integers(server: Callable[..., Server]) -> None:
    s = server(13.0)
    w = workload(dimension="concurrency", start=4, rel_tol=0.05, max_runs=12)
    res = search_capacity("http://x", w)
    assert (res.value, res.upper, res.stop_reason) == (13, 14, "converged")
    assert all(float(r.level).is_integer() for r in res.runs)
    assert all(math.isinf(x.arrival.request_rate) and x.num_prompts >= 2 * x.arrival.concurrency for x in s.runs)


def test_to_json_keeps_each_runs_metrics(server: Callable[..., Server]) -> None:
    server(37.0)
    out = search_capacity("http://x", workload(rel_tol=0.2)).to_json()
    assert out["runs"][0]["level"] == "inf" and out["value"] > 0
    assert all("p50_ttft_ms" in r["metrics"] for r in out["runs"])


def test_needs_slos_and_a_queue_visible_one_for_rates(server: Callable[..., Server]) -> None:
    with pytest.raises(ConfigError, match="needs SLOs"):
        search_capacity("http://x", parse_model(Workload, {}, "t"))
    tpot_only = parse_model(Workload, {"slos": {"mean_tpot_ms": 30}}, "t")
    with pytest.raises(ConfigError, match="TTFT or E2EL SLO"):
        search_capacity("http://x", tpot_only)
    server(1e9)  # a concurrency search may use TPOT alone: TPOT grows with the batch
    settings = CapacitySearch(dimension="concurrency", start=8, rel_tol=0.01, max_runs=12)
    assert search_capacity("http://x", tpot_only, settings=settings).value == 20
