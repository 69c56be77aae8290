"""The memory model: KV capacity, OOM edges in both directions, each engine's own rules."""

from __future__ import annotations

import pytest

from autotune_sim.dialects.base import capture_sizes
from autotune_sim.dialects.sglang_args import DECODE_STEPS, PREFILL_STEPS, auto_fraction, gpu_defaults
from autotune_sim.memory import (
    GIB,
    SglangMemory,
    VllmMemory,
    footprint,
    plan_sglang,
    plan_vllm,
    step_bytes,
)
from autotune_sim.presets import GPUS, find_model

LLAMA = find_model("meta-llama/Llama-3.1-8B-Instruct")
QWEN72 = find_model("qwen2.5-72b")
H100 = GPUS["H100-80GB"]
VLLM_SIZES = [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)]


def vllm_plan(util: float, *, model=LLAMA, gpu=H100, tp: int = 1, max_len: int | None = 131072, **kw):
    assert model is not None
    fp = footprint(model, tp=tp)
    args = dict(
        max_batched_tokens=8192,
        max_num_seqs=1024,
        capture_sizes=VLLM_SIZES,
        graphs_per_size=2,
        block_size=16,
        max_model_len=max_len,
        derived_max_len=model.max_position,
    )
    args.update(kw)
    return plan_vllm(VllmMemory(gpu=gpu, fp=fp, utilization=util, **args))  # type: ignore[arg-type]


def test_kv_bytes_per_token_is_the_gqa_formula() -> None:
    assert LLAMA is not None
    # 2 (K and V) × 32 layers × 8 KV heads × 128 dims × 2 bytes = 128 KiB per token.
    assert footprint(LLAMA).kv_bytes_per_token == 131072
    assert footprint(LLAMA, kv_dtype="fp8").kv_bytes_per_token == 65536


def test_tensor_parallelism_divides_weights_and_kv() -> None:
    assert QWEN72 is not None
    one, four = footprint(QWEN72), footprint(QWEN72, tp=4)
    assert four.kv_bytes_per_token == one.kv_bytes_per_token // 4
    assert four.weight_bytes < one.weight_bytes / 3.9
    # More TP ranks than KV heads replicate the heads instead of splitting them further.
    assert footprint(QWEN72, tp=16).kv_bytes_per_token == footprint(QWEN72, tp=8).kv_bytes_per_token


def test_vllm_default_llama_on_h100_matches_the_published_kv_size() -> None:
    plan = vllm_plan(0.9)
    assert plan.failure is None
    # vLLM reported 442,160 tokens for this setup (see autotune_sim/calibration.py).
    assert plan.kv_tokens == pytest.approx(442_160, rel=0.10)


def test_a_higher_fraction_gives_more_kv_and_less_runtime_room() -> None:
    plans = [vllm_plan(u) for u in (0.80, 0.85, 0.90, 0.95)]
    tokens = [p.kv_tokens for p in plans]
    room = [p.runtime_free for p in plans]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4
    assert room == sorted(room, reverse=True)


def test_vllm_edge_exists_under_load_not_at_startup() -> None:
    assert LLAMA is not None
    fp = footprint(LLAMA)
    full_step = step_bytes(fp, 8192, 1024)
    safe, edge = vllm_plan(0.92), vllm_plan(0.97)
    assert safe.failure is None and safe.runtime_free > full_step
    # 0.97 starts (startup checks pass) but a full prefill batch does not fit: the runtime OOM trap.
    assert edge.failure is None and edge.runtime_free < full_step


def test_vllm_too_high_fails_the_free_memory_check() -> None:
    assert vllm_plan(1.0).failure == "free_memory"


def test_vllm_too_low_has_no_room_for_a_max_length_request() -> None:
    plan = vllm_plan(0.3)
    assert plan.failure == "kv_too_small"
    assert 0 < plan.estimated_max_len < 131072
    assert vllm_plan(0.3, max_len=8192).failure is None
    assert vllm_plan(0.19).failure == "no_kv"


def test_vllm_auto_fit_shrinks_the_context_instead_of_failing() -> None:
    plan = vllm_plan(0.3, max_len=None)
    assert plan.failure is None and plan.max_model_len == plan.estimated_max_len < 131072


def test_vllm_activation_peak_grows_with_the_token_budget() -> None:
    small, big = vllm_plan(0.9, max_batched_tokens=2048), vllm_plan(0.9, max_batched_tokens=32768)
    assert big.peak > small.peak and big.kv_tokens < small.kv_tokens


def test_vllm_graph_memory_grows_with_the_captured_batch() -> None:
    small = vllm_plan(0.9, capture_sizes=[1, 2, 4, 8, 16, 32])
    big = vllm_plan(0.9)
    none = vllm_plan(0.9, capture_sizes=[], graphs_per_size=0)
    assert none.graph_actual == 0 < small.graph_actual < big.graph_actual
    assert big.graph_estimate < big.graph_actual  # the start-up estimate undercounts


def test_72b_does_not_load_on_one_h100_but_does_on_four() -> None:
    # 72B in bf16 is ~145 GB of weights: more than one H100 holds, so the load itself fails.
    assert vllm_plan(0.9, model=QWEN72, max_len=32768).failure == "load_oom"
    assert vllm_plan(0.9, model=QWEN72, tp=4, max_len=32768).failure is None


@pytest.mark.parametrize(("gpu", "expected"), [("H100-80GB", 0.83), ("H200-141GB", 0.903), ("A100-40GB", 0.823)])
def test_sglang_auto_fraction_matches_its_memory_hook(gpu: str, expected: float) -> None:
    preset = GPUS[gpu]
    chunk, bs = gpu_defaults(preset, tp=1)
    prefill = capture_sizes(chunk, PREFILL_STEPS)
    assert auto_fraction(preset, chunk, 1, 1, bs, len(prefill)) == pytest.approx(expected, abs=0.001)


def sglang_plan(fraction: float, decode_bs: int = 256):
    assert LLAMA is not None
    return plan_sglang(
        SglangMemory(
            gpu=H100,
            fp=footprint(LLAMA),
            mem_fraction_static=fraction,
            max_total_tokens=None,
            page_size=1,
            decode_sizes=capture_sizes(decode_bs, DECODE_STEPS),
            prefill_sizes=capture_sizes(8192, PREFILL_STEPS),
        )
    )


def test_sglang_pool_grows_with_the_static_fraction_and_headroom_shrinks() -> None:
    low, high = sglang_plan(0.80), sglang_plan(0.90)
    assert low.failure is None and high.failure is None
    assert high.kv_tokens > low.kv_tokens
    assert high.available < low.available
    # rest = free after weights − pre × (1 − f): the token count follows the fraction linearly.
    assert (high.kv_tokens - low.kv_tokens) * footprint(LLAMA).kv_bytes_per_token == pytest.approx(  # type: ignore[arg-type]
        0.10 * high.pre, rel=0.01
    )


def test_sglang_fraction_too_low_leaves_no_room_after_the_weights() -> None:
    plan = sglang_plan(0.15)
    assert plan.failure == "weights_no_room"
    assert 0.15 < plan.min_fraction < 0.25


def test_sglang_fraction_too_high_fails_graph_capture() -> None:
    # The prefill graphs are captured first, so the headroom a 0.995 pool leaves runs out there.
    assert sglang_plan(0.995, decode_bs=1024).failure == "capture_oom_prefill"


def test_sglang_runtime_room_is_the_summary_lines_headroom_less_a_reserve() -> None:
    plan = sglang_plan(0.90)
    assert 0 < plan.runtime_free < plan.available
    assert plan.available / GIB == pytest.approx(7.0, abs=1.5)  # the guides' "5–8 GB is right" band
