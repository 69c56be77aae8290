"""run_workload against a fake OpenAI server behind httpx.MockTransport."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import httpx
import pytest
from fake_openai import FakeOpenAI

from autotune.bench.loadgen import BenchProgress, BenchResult, run_workload, run_workload_sync
from autotune.bench.selfcheck import assess_client
from autotune.bench.transport import ClientLanes
from autotune.config import Arrival, Dataset, Workload
from autotune.errors import BenchmarkError

BASE = "http://server:8000"


def workload(**kw: Any) -> Workload:
    base: dict[str, Any] = {
        "num_prompts": 12,
        "warmup_requests": 2,
        "dataset": Dataset(input_len=64, output_len=6),
        "seed": 1,
    }
    return Workload(**{**base, **kw})


def run(fake: FakeOpenAI, w: Workload, **kw: Any) -> BenchResult:
    async def go() -> BenchResult:
        async with fake.client() as client:
            return await run_workload(BASE, w, client=client, **kw)

    return asyncio.run(go())


def test_completions_run_sends_vllm_bench_bodies_and_measures(fake: FakeOpenAI) -> None:
    res = run(fake, workload(), api_key="sk-test")
    assert len(fake.bodies) == 14  # 2 warm-up + 12 measured
    assert len(res.records) == 12  # warm-up excluded
    body = fake.bodies[-1]
    assert body["model"] == "fake-model"
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["ignore_eos"] is True and body["temperature"] == 0.0
    assert body["max_tokens"] == 6 and isinstance(body["prompt"], list) and len(body["prompt"]) == 64
    assert all(h["authorization"] == "Bearer sk-test" for h in fake.headers)
    m = res.metrics
    assert m["completed"] == 12 and m["failed"] == 0
    assert m["total_output_tokens"] == 72 and m["total_input_tokens"] == 12 * 64
    assert res.clamped_requests == 0 and res.prompt_len_mismatches == 0
    assert res.model == "fake-model" and res.prompt_format == "ids"
    assert all(len(r.itl) == 5 for r in res.records)


def test_to_json_has_vllm_keys_first_and_our_extras(fake: FakeOpenAI) -> None:
    out = run(fake, workload(arrival=Arrival(concurrency=3))).to_json()
    for key in (
        "date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
        "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
        "request_throughput", "output_throughput", "total_token_throughput", "mean_ttft_ms",
        "median_tpot_ms", "p99_itl_ms", "std_e2el_ms", "max_output_tokens_per_s",
        "max_concurrent_requests", "mean_client_queue_time_ms", "error_rate", "client_limited",
    ):  # fmt: skip
        assert key in out, key
    assert out["backend"] == "openai" and out["request_rate"] == "inf" and out["max_concurrency"] == 3
    assert "e2el_including_client_queue" not in "".join(out)  # vLLM adds it for finite rates only
    assert "ttfts" not in out
    json.dumps(out)  # serializable


def test_to_json_detailed_and_nan_as_null(fake: FakeOpenAI) -> None:
    fake.fail_every = 1  # every completion fails
    res = run(fake, workload(warmup_requests=0))
    out = res.to_json(detailed=True)
    assert out["completed"] == 0 and out["error_rate"] == 1.0
    assert out["mean_ttft_ms"] is None and out["p99_e2el_ms"] is None
    assert out["errors"][0].startswith("HTTP 500")
    assert len(out["itls"]) == 12
    assert out["error_samples"] == {out["errors"][0]: 12}


def test_chat_sends_text_messages_and_counts_the_role_chunk(fake: FakeOpenAI) -> None:
    res = run(fake, workload(endpoint="chat"))
    body = fake.bodies[-1]
    assert isinstance(body["messages"][0]["content"], str) and body["messages"][0]["role"] == "user"
    assert body["max_completion_tokens"] == 6 and "max_tokens" not in body
    assert res.prompt_format == "text"
    assert all(r.n_chunks == 7 and r.n_empty_chunks == 1 and r.output_tokens == 6 for r in res.records)
    assert res.prompt_len_mismatches == 0  # the chat template makes the count inexact: not checked


def test_chat_refuses_token_id_prompts(fake: FakeOpenAI) -> None:
    with pytest.raises(BenchmarkError, match="chat requests need text prompts"):
        run(fake, workload(endpoint="chat"), prompt_format="ids")


def test_text_completions_land_on_the_server_count(fake: FakeOpenAI) -> None:
    res = run(fake, workload(dataset=Dataset(input_len=80, output_len=3, range_ratio=0.25)), prompt_format="text")
    assert res.prompt_len_mismatches == 0 and res.prompts_off_target == 0
    assert all(isinstance(b["prompt"], str) for b in fake.bodies)
    assert res.metrics["completed"] == 12


def test_clamped_outputs_are_counted(fake: FakeOpenAI) -> None:
    fake.clamp = 4
    res = run(fake, workload(dataset=Dataset(input_len=32, output_len=6, range_ratio=0.5)))
    expected = sum(r.expected_output_len > 4 for r in res.records)
    assert expected > 0 and res.clamped_requests == expected
    assert res.to_json()["clamped_requests"] == expected


def test_concurrency_cap_is_respected_and_reached(fake: FakeOpenAI) -> None:
    fake.token_delay_s = 0.002
    res = run(fake, workload(num_prompts=20, arrival=Arrival(concurrency=3)))
    assert fake.max_in_flight == 3
    assert res.metrics["completed"] == 20
    assert any(r.client_queue_time > 0 for r in res.records)


def _bodies(fake: FakeOpenAI) -> list[str]:
    out = sorted(json.dumps(b, sort_keys=True) for b in fake.bodies)
    fake.bodies.clear()
    return out


def test_same_seed_and_salt_send_identical_requests(fake: FakeOpenAI) -> None:
    run(fake, workload(), salt=7)
    first = _bodies(fake)
    run(fake, workload(), salt=7)
    assert _bodies(fake) == first
    run(fake, workload(seed=2), salt=7)
    assert _bodies(fake) != first


def _shapes(fake: FakeOpenAI) -> list[tuple[int, int]]:
    return sorted((len(b["prompt"]), b["max_tokens"]) for b in fake.bodies)


def test_repeated_runs_get_fresh_content_with_the_same_lengths(fake: FakeOpenAI) -> None:
    w = workload(dataset=Dataset(input_len=64, output_len=6, range_ratio=0.5, prefix_len=32))
    first = run(fake, w)
    shapes, prompts = _shapes(fake), {tuple(b["prompt"]) for b in fake.bodies}
    fake.bodies.clear()
    second = run(fake, w)
    assert second.salt != first.salt
    assert _shapes(fake) == shapes
    assert not prompts & {tuple(b["prompt"]) for b in fake.bodies}  # not even the shared prefix repeats
    fake.bodies.clear()
    run(fake, w.model_copy(update={"fresh_prompts_per_run": False}))
    run(fake, w.model_copy(update={"fresh_prompts_per_run": False}))
    assert len({tuple(b["prompt"]) for b in fake.bodies}) == len(fake.bodies) // 2


def test_failures_are_data_and_error_rate_counts_them(fake: FakeOpenAI) -> None:
    fake.fail_every = 4
    res = run(fake, workload(warmup_requests=0))
    assert res.metrics["failed"] == 3 and res.metrics["error_rate"] == 0.25


def test_goodput_comes_from_the_workload_slos(fake: FakeOpenAI) -> None:
    res = run(fake, workload(slos={"p97_ttft_ms": 60_000.0}))
    m = res.metrics
    assert m["request_goodput"] == pytest.approx(m["request_throughput"])
    assert "p97_ttft_ms" in m  # SLO percentiles are computed so the SLO can be checked


def test_deadline_cuts_a_hung_run_and_marks_requests(fake: FakeOpenAI) -> None:
    fake.hang = True
    res = run(fake, workload(warmup_requests=0, num_prompts=4), deadline_s=0.2)
    assert res.deadline_hit
    assert res.metrics["failed"] == 4
    assert all("run deadline (0.2 s)" in r.error for r in res.records)


def test_progress_reports_each_phase_to_completion(fake: FakeOpenAI) -> None:
    seen: list[BenchProgress] = []
    run(fake, workload(), on_progress=seen.append)
    finals = [p for p in seen if p.completed == p.total]
    assert {(p.phase, p.total) for p in finals} == {("warmup", 2), ("measure", 12)}
    assert seen[-1].output_throughput > 0


def test_model_is_discovered_from_v1_models(fake: FakeOpenAI) -> None:
    fake.model = "served-name"
    assert run(fake, workload()).model == "served-name"
    assert fake.bodies[-1]["model"] == "served-name"


@pytest.mark.sim
def test_unreachable_server_is_a_benchmark_error() -> None:
    with pytest.raises(BenchmarkError, match=r"^cannot reach http://127\.0\.0\.1:9/v1/models"):
        run_workload_sync("http://127.0.0.1:9", workload())


def test_server_without_tokenize_is_a_benchmark_error(fake: FakeOpenAI) -> None:
    fake.has_tokenize = False
    with pytest.raises(BenchmarkError, match="/tokenize answered 404"):
        run(fake, workload())


def test_sync_wrapper_refuses_a_running_loop() -> None:
    async def inside() -> None:
        run_workload_sync(BASE, workload())

    with pytest.raises(RuntimeError, match="await run_workload instead"):
        asyncio.run(inside())


def test_assess_client_names_each_crossed_threshold() -> None:
    ok = assess_client(0.3, [0.001] * 100, [0.0005] * 100, finite_rate=True)
    assert not ok.limited and ok.reason == "" and ok.kind == ""
    busy = assess_client(0.95, [0.2] * 100, [0.12] * 100, finite_rate=True)
    assert busy.limited and busy.kind == "cpu_bound"
    assert busy.reason == (
        "client event loop busy 95% of the run; "
        "p99 send lag 200.0 ms behind the arrival schedule (tolerance 50 ms); "
        "p99 event-loop lag 120.0 ms (timestamps are late by that much; tolerance 50 ms)"
    )
    starved = assess_client(0.3, [], [0.2] * 100, finite_rate=False)
    assert starved.kind == "starved"
    assert starved.reason.endswith("the loop was idle 70% of the run yet woke late: other processes took its CPU")
    behind = assess_client(0.3, [0.2] * 100, [0.001] * 100, finite_rate=True)
    assert behind.kind == "schedule_behind"
    # With an infinite rate everything is due at t=0; the send lag is just task creation.
    assert not assess_client(0.2, [0.5] * 10, [0.0] * 10, finite_rate=False).limited
    assert math.isclose(busy.max_loop_lag_ms, 120.0)


def test_lanes_open_one_client_per_concurrent_request_and_reuse_the_warmest() -> None:
    async def go() -> None:
        lanes = ClientLanes(5.0)
        a, b = lanes.acquire(), lanes.acquire()
        assert a is not b and lanes.opened == 2
        lanes.release(a)
        lanes.release(b)
        assert lanes.acquire() is b  # most recently freed first: its connection is the warmest
        await lanes.aclose()
        assert a.is_closed and b.is_closed

        shared = httpx.AsyncClient()
        lanes = ClientLanes(5.0, shared=shared)
        assert lanes.acquire() is shared and lanes.acquire() is shared and lanes.opened == 0
        await lanes.aclose()
        assert not shared.is_closed
        await shared.aclose()

    asyncio.run(go())
