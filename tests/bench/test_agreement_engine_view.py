"""The agreement benchmark's engine-side account of a run: what the engine was sent and how it
served it, from two scrapes of its counters, so a gap between the clients can be placed."""

from __future__ import annotations

from typing import Any

import pytest
from benchmark_loader import load_benchmark


@pytest.fixture(scope="module")
def agreement() -> Any:
    return load_benchmark("loadgen_agreement")


def _scrape(requests: float, e2e_s: float, prompt: float, itl: tuple[float, float]) -> dict[str, float]:
    return {
        'vllm:request_success_total{engine="0",finished_reason="length"}': requests,
        'vllm:prompt_tokens_total{engine="0"}': prompt,
        'vllm:prompt_tokens_cached_total{engine="0"}': 999.0,  # another metric sharing the prefix
        'vllm:generation_tokens_total{engine="0"}': requests * 64,
        'vllm:e2e_request_latency_seconds_sum{engine="0"}': e2e_s,
        'vllm:e2e_request_latency_seconds_count{engine="0"}': requests,
        'vllm:inter_token_latency_seconds_sum{engine="0"}': itl[0],
        'vllm:inter_token_latency_seconds_count{engine="0"}': itl[1],
        'vllm:num_preemptions_total{engine="0"}': 3.0,
    }


def test_the_engine_view_is_the_increase_over_the_run(agreement: Any) -> None:
    before = _scrape(4, 2.0, 512, (1.0, 252))  # the warm-up requests
    after = _scrape(604, 302.0, 512 + 600 * 130, (1.0 + 600 * 63 * 0.008, 252 + 600 * 63))
    view = agreement.engine_view(before, after, duration_s=10.0)
    assert view["requests"] == 600
    assert view["prompt_tokens_per_request"] == pytest.approx(130.0)  # not 128: the prompts it was sent
    assert view["generation_tokens"] == 600 * 64
    assert view["mean_itl_ms"] == pytest.approx(8.0)
    assert view["mean_e2e_ms"] == pytest.approx(500.0)
    # 300 s of request time in a 10 s run: the client kept 30 requests at the engine on average.
    assert view["requests_held"] == pytest.approx(30.0)
    assert view["preemptions"] == 0.0
    assert view["mean_ttft_ms"] is None  # not exported: said, not guessed


def test_an_unreadable_engine_gives_an_unknown_view_not_zeros(agreement: Any) -> None:
    readable = _scrape(4, 2.0, 512, (1.0, 252))
    for before, after in (({}, readable), (readable, {})):
        view = agreement.engine_view(before, after, duration_s=10.0)
        assert set(view) == set(agreement.ENGINE_VIEW_KEYS) and all(v is None for v in view.values())
