"""The step-time model: roofline bounds, CUDA-graph launch savings, MoE expert traffic, TP cost."""

from __future__ import annotations

import pytest

from autotune_sim.memory import footprint
from autotune_sim.perf import GraphMode, PerfModel, StepShape
from autotune_sim.presets import GPUS, find_model


def perf(model: str = "llama-3.1-8b", gpu: str = "H100-80GB", tp: int = 1) -> PerfModel:
    preset = find_model(model)
    assert preset is not None
    return PerfModel(preset, GPUS[gpu], footprint(preset, tp=tp), tp=tp)


def test_small_batch_decode_is_memory_bound_and_near_the_bandwidth_bound() -> None:
    p = perf()
    step = p.decode_step(1, 512, GraphMode.FULL)
    assert p.bandwidth_bound(1, 512) < step < 1.5 * p.bandwidth_bound(1, 512)


def test_a_faster_memory_makes_decode_faster_in_proportion() -> None:
    h100, h200 = perf(gpu="H100-80GB"), perf(gpu="H200-141GB")
    ratio = h100.gpu_time(StepShape(1, 1, 512, 0, 0, 1, GraphMode.FULL)) / h200.gpu_time(
        StepShape(1, 1, 512, 0, 0, 1, GraphMode.FULL)
    )
    assert ratio == pytest.approx(4.8 / 3.35, rel=0.01)


def test_large_prefill_is_compute_bound() -> None:
    p = perf()
    shape = StepShape(8192, 0, 0, 8192 * 4096.0, 0, 1, GraphMode.EAGER)
    flops_time = p.gpu_time(shape)
    assert flops_time > p.weight_bytes(8192) / (3.35e12 * 0.82) * 5


def test_cuda_graphs_help_small_batches_much_more_than_large_ones() -> None:
    p = perf()

    def speedup(batch: int) -> float:
        return p.decode_step(batch, 512, GraphMode.EAGER) / p.decode_step(batch, 512, GraphMode.FULL)

    assert speedup(1) > 1.1  # sglang#1401: 1.12–1.31× at batch 1 (issue 21)
    assert speedup(1) > speedup(64) > speedup(512) > 1.0
    piecewise = p.decode_step(1, 512, GraphMode.PIECEWISE)
    assert p.decode_step(1, 512, GraphMode.FULL) < piecewise < p.decode_step(1, 512, GraphMode.EAGER)


def test_per_token_cost_falls_then_levels_off_with_batch() -> None:
    p = perf()
    per_token = [p.decode_step(b, 1024, GraphMode.FULL) / b for b in (1, 8, 64, 512)]
    assert per_token == sorted(per_token, reverse=True)
    assert per_token[0] / per_token[1] > 5  # weights are read once for the whole batch
    assert per_token[2] / per_token[3] < 3  # KV traffic and FLOPs grow with the batch


def test_moe_reads_more_experts_as_the_batch_grows() -> None:
    p = perf("qwen3-30b-a3b")
    assert p.weight_bytes(1) < p.weight_bytes(8) < p.weight_bytes(256)
    assert p.weight_bytes(4096) == pytest.approx(p.fp.weight_bytes, rel=0.001)
    assert p.weight_bytes(1) < 0.2 * p.fp.weight_bytes  # 8 of 128 experts


def test_tensor_parallel_all_reduce_costs_time() -> None:
    one, four = perf("qwen2.5-72b", tp=1), perf("qwen2.5-72b", tp=4)
    shape = StepShape(4096, 0, 0, 4096 * 2048.0, 0, 1, GraphMode.EAGER)
    assert four.gpu_time(shape) > one.gpu_time(shape) / 4
