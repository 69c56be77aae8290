"""Metric math on hand-made records, checked against numbers worked out by hand and with numpy."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autotune.bench.metrics import (
    RequestRecord,
    compute_metrics,
    latency_stats,
    percentile_key,
    request_slos,
    slo_violations,
)


def rec(start: float, ttft: float, itl: list[float], out: int, prompt: int = 10, **kw: object) -> RequestRecord:
    return RequestRecord(
        success=True,
        prompt_len=prompt,
        output_tokens=out,
        ttft=ttft,
        itl=itl,
        latency=ttft + sum(itl),
        start_time=start,
        n_chunks=len(itl) + 1,
        usage_seen=True,
        **kw,  # type: ignore[arg-type]
    )


@pytest.fixture
def records() -> list[RequestRecord]:
    return [
        rec(0.0, 0.100, [0.02, 0.03, 0.05], out=4, prompt=10),  # TPOT (0.2-0.1)/3
        rec(0.5, 0.050, [], out=1, prompt=20),  # n = 1: no TPOT
        # vLLM docs example: 3 tokens in one chunk; two 40 ms gaps -> ITL 40 ms, TPOT 20 ms.
        rec(1.0, 0.100, [0.04, 0.04], out=5, prompt=30),
        RequestRecord(success=False, error="HTTP 500: boom", prompt_len=99, start_time=1.2),
    ]


def test_counts_and_throughputs_use_successful_requests_only(records: list[RequestRecord]) -> None:
    m = compute_metrics(records, 2.0)
    assert m["completed"] == 3 and m["failed"] == 1
    assert m["error_rate"] == 0.25
    assert m["total_input_tokens"] == 60  # the failed request's 99 is not counted
    assert m["total_output_tokens"] == 10
    assert m["request_throughput"] == 1.5
    assert m["output_throughput"] == 5.0
    assert m["total_token_throughput"] == 35.0
    assert m["duration"] == 2.0
    assert m["mean_tokens_per_chunk"] == pytest.approx(10 / 8)  # 4 + 1 + 3 chunks


def test_tpot_skips_single_token_requests_and_uses_tokens_not_chunks(records: list[RequestRecord]) -> None:
    m = compute_metrics(records, 2.0)
    tpots_ms = [(0.2 - 0.1) / 3 * 1000, 20.0]
    assert m["mean_tpot_ms"] == pytest.approx(np.mean(tpots_ms))
    assert m["median_tpot_ms"] == pytest.approx(np.median(tpots_ms))
    assert m["std_tpot_ms"] == pytest.approx(np.std(tpots_ms))  # population std
    assert m["p99_tpot_ms"] == pytest.approx(np.percentile(tpots_ms, 99))


def test_itl_is_pooled_per_chunk(records: list[RequestRecord]) -> None:
    m = compute_metrics(records, 2.0, percentiles=(25, 50, 99.9))
    itls_ms = [20.0, 30.0, 50.0, 40.0, 40.0]
    assert m["mean_itl_ms"] == pytest.approx(36.0)
    assert m["std_itl_ms"] == pytest.approx(np.std(itls_ms))
    assert m["p25_itl_ms"] == pytest.approx(30.0)  # linear: sorted [20,30,40,40,50], rank 1
    assert m["p99.9_itl_ms"] == pytest.approx(np.percentile(itls_ms, 99.9))
    assert "p99_itl_ms" not in m


def test_ttft_and_e2el_always_reported(records: list[RequestRecord]) -> None:
    m = compute_metrics(records, 2.0)
    assert m["mean_ttft_ms"] == pytest.approx(250 / 3)
    assert m["median_e2el_ms"] == pytest.approx(180.0)
    assert m["p90_e2el_ms"] == pytest.approx(np.percentile([200.0, 50.0, 180.0], 90))
    for key in ("mean_e2el_ms", "std_e2el_ms", "p50_ttft_ms", "p95_ttft_ms", "p99_e2el_ms"):
        assert key in m


def test_goodput_counts_requests_within_every_bound(records: list[RequestRecord]) -> None:
    assert "request_goodput" not in compute_metrics(records, 2.0)
    # Only the 50 ms request meets TTFT <= 80 ms.
    assert compute_metrics(records, 2.0, goodput_slos={"ttft": 80})["request_goodput"] == 0.5
    # TTFT <= 100 (bound inclusive) and TPOT <= 25: request 1 fails TPOT (33.3 ms); the n=1
    # request counts its TPOT as 0.
    m = compute_metrics(records, 2.0, goodput_slos={"ttft": 100, "tpot": 25})
    assert m["request_goodput"] == 1.0
    assert compute_metrics(records, 2.0, goodput_slos={"e2el": 190})["request_goodput"] == 1.0


def test_unknown_goodput_metric_and_bad_duration_are_errors(records: list[RequestRecord]) -> None:
    with pytest.raises(ValueError, match="itl"):
        compute_metrics(records, 2.0, goodput_slos={"itl": 10})
    with pytest.raises(ValueError, match="duration_s"):
        compute_metrics(records, 0.0)


def test_only_single_token_outputs_leave_tpot_undefined() -> None:
    m = compute_metrics([rec(0.0, 0.05, [], out=1), rec(0.1, 0.07, [], out=1)], 1.0)
    assert math.isnan(m["mean_tpot_ms"]) and math.isnan(m["p99_tpot_ms"])
    assert math.isnan(m["mean_itl_ms"])
    assert m["mean_e2el_ms"] == pytest.approx(60.0)


def test_all_failed_gives_nan_latencies_not_zero() -> None:
    m = compute_metrics([RequestRecord(error="x"), RequestRecord(error="y")], 1.0)
    assert m["completed"] == 0 and m["error_rate"] == 1.0
    assert math.isnan(m["mean_ttft_ms"]) and math.isnan(m["p99_e2el_ms"])
    assert m["max_concurrent_requests"] == 0


def test_missing_usage_falls_back_to_token_chunks() -> None:
    r = rec(0.0, 0.1, [0.01, 0.01], out=0)
    r.usage_seen = False
    assert r.output_len == 3
    assert compute_metrics([r], 1.0)["total_output_tokens"] == 3


def test_peaks_match_vllm_buckets() -> None:
    # Request A: tokens at 0.1, 0.6, 1.1, 1.2 s; B starts at 1.05: tokens at 1.15, 1.25.
    a = rec(0.0, 0.1, [0.5, 0.5, 0.1], out=4)
    b = rec(1.05, 0.1, [0.1], out=2)
    m = compute_metrics([a, b], 2.0)
    assert m["max_output_tokens_per_s"] == 4.0  # second 1: 1.1, 1.2 (A) + 1.15, 1.25 (B)
    assert m["max_concurrent_requests"] == 2


def test_latency_stats_keys_and_percentile_names() -> None:
    stats = latency_stats("ttft", [0.1, 0.2, 0.3], [50, 99.5])
    assert stats == pytest.approx(
        {
            "mean_ttft_ms": 200.0,
            "median_ttft_ms": 200.0,
            "std_ttft_ms": float(np.std([100, 200, 300])),
            "p50_ttft_ms": 200.0,
            "p99.5_ttft_ms": float(np.percentile([100, 200, 300], 99.5)),
        }
    )
    assert percentile_key(99.0, "itl") == "p99_itl_ms"


def test_slo_violations_report_amount_over_and_missing_as_inf() -> None:
    metrics = {"p95_ttft_ms": 1200.0, "p99_tpot_ms": 30.0, "mean_e2el_ms": math.nan, "p90_itl_ms": None}
    slos = {"p95_ttft_ms": 1000.0, "p99_tpot_ms": 50.0, "mean_e2el_ms": 1.0, "p90_itl_ms": 5.0, "p97_ttft_ms": 1.0}
    over = slo_violations(metrics, slos)
    assert over == {"p95_ttft_ms": 200.0, "mean_e2el_ms": math.inf, "p90_itl_ms": math.inf, "p97_ttft_ms": math.inf}


def test_request_slos_take_the_tightest_bound_per_metric() -> None:
    slos = {"p95_ttft_ms": 500.0, "p99_ttft_ms": 800.0, "mean_tpot_ms": 40.0, "p99_itl_ms": 20.0}
    assert request_slos(slos) == {"ttft": 500.0, "tpot": 40.0}
