"""Continuous batching, chunked prefill, prefix caching, preemption (vLLM) and retraction (SGLang)."""

from __future__ import annotations

from autotune_sim.kvcache import BlockPool
from autotune_sim.memory import footprint
from autotune_sim.offline import simulate
from autotune_sim.perf import GraphMode, PerfModel
from autotune_sim.presets import GPUS, find_model
from autotune_sim.scheduler import SglangScheduler, SimRequest, VllmScheduler
from autotune_sim.stats import EngineStats

LLAMA = find_model("llama-3.1-8b")
assert LLAMA is not None
PERF = PerfModel(LLAMA, GPUS["H100-80GB"], footprint(LLAMA))


def out_token(seed: int, i: int) -> int:
    return 1000 + (seed + i) % 50


def vllm(blocks: int = 10_000, caching: bool = True, **kw: object) -> VllmScheduler:
    args: dict[str, object] = dict(
        max_num_seqs=256,
        max_batched_tokens=2048,
        chunked_prefill=True,
        long_prefill_threshold=0,
        priority_policy=False,
        reserve_full_isl=True,
        graph_mode="FULL_AND_PIECEWISE",
        max_capture=512,
    )
    args.update(kw)
    return VllmScheduler(BlockPool(blocks, 16, caching), EngineStats(max_model_len=32768), out_token, **args)  # type: ignore[arg-type]


def sglang(blocks: int = 10_000, **kw: object) -> SglangScheduler:
    args: dict[str, object] = dict(
        max_running=256,
        chunked_prefill_size=2048,
        max_prefill_tokens=16384,
        conservativeness=1.0,
        policy="fcfs",
        mixed_chunk=False,
        decode_graph_max_bs=256,
        prefill_graph_max_tokens=2048,
    )
    args.update(kw)
    return SglangScheduler(BlockPool(blocks, 16, True), EngineStats(max_model_len=32768), out_token, **args)  # type: ignore[arg-type]


def req(rid: int, prompt_len: int, out: int = 8, base: int = 0) -> SimRequest:
    return SimRequest(rid, [base + rid * 100_000 + j for j in range(prompt_len)], out, "length", out, rid)


def distinct(i: int, n: int = 512) -> list[int]:
    return [(i * 7919 + j) % 30_000 + 300 for j in range(n)]


# ------------------------------------------------------------------------------------ vLLM
def test_vllm_batch_respects_token_budget_and_running_cap() -> None:
    s = vllm(max_num_seqs=4, max_batched_tokens=1000)
    for i in range(6):
        s.add(req(i, 300))
    batch = s.schedule(0.0)
    assert batch is not None
    assert sum(n for _, n in batch.items) == 1000  # 300 + 300 + 300 + a 100-token chunk
    assert [n for _, n in batch.items] == [300, 300, 300, 100]
    assert len(s.running) == 4 and len(s.waiting) == 2


def test_vllm_chunked_prefill_splits_a_long_prompt_and_mixes_decodes() -> None:
    s = vllm(max_batched_tokens=512)
    s.add(req(0, 100))
    first = s.schedule(0.0)
    assert first is not None
    s.commit(first)  # request 0 finished its prompt and sampled a token
    s.add(req(1, 1500))
    batch = s.schedule(0.0)
    assert batch is not None
    assert [n for _, n in batch.items] == [1, 511]  # decode first, then a chunk of the long prompt
    assert batch.kind == "mixed" and batch.shape.decode_seqs == 1


def test_vllm_without_chunked_prefill_a_prompt_must_fit_the_budget() -> None:
    s = vllm(max_batched_tokens=1024, chunked_prefill=False)
    s.add(req(0, 600))
    s.add(req(1, 600))
    batch = s.schedule(0.0)
    assert batch is not None and [n for _, n in batch.items] == [600]


def test_vllm_pure_decode_batches_use_the_full_graph_up_to_the_captured_size() -> None:
    s = vllm(max_capture=4)
    for i in range(6):
        s.add(req(i, 10, out=100))
    s.commit(s.schedule(0.0))  # type: ignore[arg-type]
    batch = s.schedule(0.0)
    assert batch is not None and batch.kind == "decode"
    assert batch.shape.graph is GraphMode.EAGER  # 6 sequences > 4 captured
    small = vllm(max_capture=8)
    for i in range(6):
        small.add(req(i, 10, out=100))
    small.commit(small.schedule(0.0))  # type: ignore[arg-type]
    assert small.schedule(0.0).shape.graph is GraphMode.FULL  # type: ignore[union-attr]


def test_vllm_prefix_cache_reuses_full_blocks_of_a_shared_prefix() -> None:
    s = vllm()
    shared = list(range(5000, 5000 + 320))
    first = SimRequest(0, [*shared, 1, 2, 3], 4, "length", 4, 0)
    s.add(first)
    s.commit(s.schedule(0.0))  # type: ignore[arg-type]
    second = SimRequest(1, [*shared, 7, 8, 9], 4, "length", 4, 1)
    s.add(second)
    batch = s.schedule(0.0)
    assert batch is not None
    assert second.cached == 320 and dict((r.rid, n) for r, n in batch.items)[1] == 3
    assert s.stats.prefix_hits == 320


def test_vllm_without_prefix_caching_nothing_is_reused() -> None:
    s = vllm(caching=False)
    for rid in range(2):
        s.add(SimRequest(rid, list(range(400)), 4, "length", 4, rid))
    s.schedule(0.0)
    assert s.stats.prefix_hits == 0


def test_vllm_preempts_when_running_requests_outgrow_the_pool() -> None:
    # 64 blocks × 16 = 1024 tokens of KV; 8 requests of 100 + 200 tokens need 2400.
    s = vllm(blocks=64, max_num_seqs=8)
    result = simulate(s, PERF, requests=8, concurrency=8, prompt=distinct_100, output_len=200)
    assert result.output_tokens == 8 * 200
    assert result.preemptions > 0


def distinct_100(i: int) -> list[int]:
    return distinct(i, 100)


def test_vllm_no_preemption_when_the_pool_holds_every_running_request() -> None:
    s = vllm(blocks=400, max_num_seqs=8)
    result = simulate(s, PERF, requests=16, concurrency=8, prompt=distinct_100, output_len=200)
    assert result.preemptions == 0 and result.output_tokens == 16 * 200


def test_vllm_throughput_rises_with_max_running_then_saturates() -> None:
    def throughput(max_running: int) -> float:
        s = vllm(max_num_seqs=max_running, max_batched_tokens=max(2048, max_running))
        return simulate(
            s,
            PERF,
            requests=2 * max_running,
            concurrency=max_running,
            prompt=lambda i: distinct(i, 128),
            output_len=128,
        ).output_throughput

    t1, t16, t256, t1024 = (throughput(n) for n in (1, 16, 256, 1024))
    assert t1 < t16 < t256
    assert t16 / t1 > 8 and t1024 / t256 < 1.6


# ---------------------------------------------------------------------------------- SGLang
def test_sglang_alternates_prefill_and_decode_batches() -> None:
    s = sglang()
    s.add(req(0, 100, out=4))
    prefill = s.schedule(0.0)
    assert prefill is not None and prefill.kind == "prefill"
    s.commit(prefill)
    assert len(s.running) == 1
    s.add(req(1, 100, out=4))
    assert s.schedule(0.0).kind == "prefill"  # type: ignore[union-attr]  # new work first
    decode = s.schedule(0.0)
    assert decode is not None and decode.kind == "decode" and decode.shape.graph is GraphMode.FULL


def test_sglang_chunks_a_prompt_longer_than_the_chunk_size() -> None:
    s = sglang(chunked_prefill_size=1024)
    s.add(req(0, 2500))
    sizes = []
    for _ in range(3):
        batch = s.schedule(0.0)
        assert batch is not None
        sizes.append(sum(n for _, n in batch.items))
        s.commit(batch)
    assert sizes == [1024, 1024, 452]


def test_sglang_retracts_when_decode_runs_out_of_kv() -> None:
    # Low conservativeness admits more than the pool can hold once the outputs grow.
    s = sglang(blocks=256, conservativeness=0.1, max_running=64)
    result = simulate(s, PERF, requests=32, concurrency=32, prompt=lambda i: distinct(i, 64), output_len=256)
    assert result.retractions > 0 and result.output_tokens == 32 * 256


def test_sglang_higher_conservativeness_admits_fewer_and_retracts_less() -> None:
    def run(conservativeness: float) -> tuple[int, int]:
        s = sglang(blocks=256, conservativeness=conservativeness, max_running=64)
        r = simulate(s, PERF, requests=32, concurrency=32, prompt=lambda i: distinct(i, 64), output_len=256)
        return r.retractions, r.max_running

    low_retract, low_running = run(0.1)
    high_retract, high_running = run(2.0)
    assert high_retract < low_retract
    assert high_running <= low_running


def test_sglang_radix_cache_hits_a_repeated_prompt() -> None:
    s = sglang()
    prompt = distinct(0, 480)
    s.add(SimRequest(0, prompt, 2, "length", 2, 0))
    s.commit(s.schedule(0.0))  # type: ignore[arg-type]
    again = SimRequest(1, list(prompt), 2, "length", 2, 1)
    s.add(again)
    batch = s.schedule(0.0)
    assert batch is not None and batch.cached_tokens == 464  # 29 full pages; the last token is recomputed
    assert again.cached == 464
