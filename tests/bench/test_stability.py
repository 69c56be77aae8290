"""A run's throughput interval from per-second buckets: steady runs are pinned down, short or
bursty ones are not."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from autotune.bench.stability import MIN_BUCKETS, throughput_interval


def _run(n: int, gap_s: float, tokens: int = 64, jitter: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """``n`` requests started ``gap_s`` apart, each 1 s long, ``tokens`` tokens each."""
    rng = random.Random(seed)
    starts = [100.0 + i * gap_s for i in range(n)]
    outs = [max(1, round(tokens * (1 + rng.uniform(-jitter, jitter)))) for _ in starts]
    return {"start_times": starts, "ttfts": [0.05] * n, "latencies": [1.0] * n, "output_lens": outs}


def test_a_steady_run_has_its_rate_and_a_narrow_interval() -> None:
    interval = throughput_interval(_run(n=600, gap_s=0.05))  # 20 requests/s × 64 tokens
    assert interval.mean == pytest.approx(20 * 64, rel=0.02)
    assert interval.relative < 0.01
    assert interval.buckets >= MIN_BUCKETS


def test_a_run_of_a_few_seconds_is_too_short_to_say() -> None:
    interval = throughput_interval(_run(n=40, gap_s=0.05))  # ~3 s
    assert math.isinf(interval.relative)


def test_a_bursty_run_is_wider_than_a_steady_one() -> None:
    steady = throughput_interval(_run(n=400, gap_s=0.05, jitter=0.05))
    bursty = throughput_interval(_run(n=400, gap_s=0.05, jitter=0.9))
    assert bursty.relative > 3 * steady.relative


def test_failed_requests_and_empty_runs_carry_no_tokens() -> None:
    run = _run(n=10, gap_s=0.5)
    run["output_lens"] = [0] * 10
    assert throughput_interval(run).mean == 0.0
    assert math.isinf(throughput_interval({}).relative)
