"""vLLM's command-line quirks as the simulator parses them (in process; exit codes are covered by
the server tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune_sim.dialects.vllm_args import ConfigFailure, build_parser, preprocess, resolve
from autotune_sim.settings import load_settings


def parse(*argv: str, version: str = "0.32.0"):
    return build_parser(version).parse_args(preprocess(list(argv)))


def test_underscores_and_dashes_are_the_same_flag() -> None:
    assert parse("--max_num_seqs", "8").max_num_seqs == 8
    assert parse("--max_num_batched_tokens=4k").max_num_batched_tokens == 4000


def test_human_integers_k_is_decimal_and_capital_k_binary() -> None:
    assert parse("--max-model-len", "32k").max_model_len == 32000
    assert parse("--max-model-len", "32K").max_model_len == 32768
    assert parse("--max-model-len", "auto").max_model_len == -1
    assert parse("--kv-cache-memory", "20G").kv_cache_memory_bytes == 21474836480  # unique prefix expands


def test_dotted_compilation_config_keys_merge_into_json() -> None:
    ns = parse("-cc.cudagraph_mode=PIECEWISE", "--compilation-config.max_cudagraph_capture_size", "64")
    assert ns.compilation_config == {"cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 64}


def test_optimization_level_spellings() -> None:
    assert parse("-O3").optimization_level == 3
    assert parse("-O", "1").optimization_level == 1
    assert parse("-O=0").optimization_level == 0


def test_booleans_and_their_negations_by_version() -> None:
    assert parse("--no-enable-prefix-caching").enable_prefix_caching is False
    assert parse("--disable-prefix-caching", version="0.33.0").enable_prefix_caching is False
    assert parse("--no-enable-prefix-caching", version="0.33.0").enable_prefix_caching is False
    with pytest.raises(SystemExit):
        parse("--disable-prefix-caching")  # only from 0.33


def test_config_file_supplies_flags(tmp_path: Path) -> None:
    config = tmp_path / "serve.yaml"
    config.write_text("max_num_seqs: 12\nenable_prefix_caching: false\n")
    ns = parse("--config", str(config), "--port", "9000")
    assert (ns.max_num_seqs, ns.enable_prefix_caching, ns.port) == (12, False, 9000)


def resolved(*argv: str, gpu: str = "H100-80GB"):
    return resolve(parse("--model", "llama-3.1-8b", *argv), load_settings({"AUTOTUNE_SIM_GPU": gpu}), {})


def test_batch_defaults_follow_the_gpu() -> None:
    h100, a100 = resolved(), resolved(gpu="A100-80GB")
    assert (h100.max_num_seqs, h100.max_num_batched_tokens) == (1024, 8192)
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)
    assert resolved(gpu="H200-141GB").max_num_batched_tokens == 8192


def test_graph_capture_sizes_and_modes() -> None:
    default = resolved()
    assert default.cudagraph_mode == "FULL_AND_PIECEWISE" and default.max_capture == 512
    assert default.capture_sizes[:4] == [1, 2, 4, 8] and 248 in default.capture_sizes and 272 in default.capture_sizes
    assert resolved("--max-num-seqs", "64").max_capture == 128  # min(2 × max_num_seqs, 512)
    assert resolved("--enforce-eager").cudagraph_mode == "NONE"
    assert resolved("-O1").cudagraph_mode == "PIECEWISE"
    assert resolved("--cudagraph-capture-sizes", "1", "8", "32").capture_sizes == [1, 8, 32]


def test_both_capture_size_settings_is_an_error() -> None:
    with pytest.raises(ConfigFailure, match="set it once"):
        resolved("--max-cudagraph-capture-size", "64", "-cc.max_cudagraph_capture_size=128")


def test_tp_must_divide_the_heads() -> None:
    with pytest.raises(ConfigFailure, match=r"heads \(28\) must be divisible by tensor parallel size \(8\)"):
        resolve(parse("--model", "qwen2.5-7b", "-tp", "8"), load_settings({}), {})


def test_a_group_too_small_for_the_parallelism_fails_like_vllm() -> None:
    settings = load_settings({"CUDA_VISIBLE_DEVICES": "0,1"})
    resolve(parse("--model", "llama-3.1-8b", "-tp", "2"), settings, {})
    with pytest.raises(ConfigFailure, match="GPUs"):
        resolve(parse("--model", "llama-3.1-8b", "-tp", "4"), settings, {})
