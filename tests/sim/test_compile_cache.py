"""vLLM's torch.compile cache across simulated engine starts: which flags keep a start warm."""

from __future__ import annotations

import os
import re
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.sim, pytest.mark.slow]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
V34 = {"AUTOTUNE_SIM_VLLM_VERSION": "0.34.0"}


def started(sims: Any, env: dict[str, str], *flags: str) -> Any:
    """An engine that got through its start-up summary line (the compile artifacts are stored)."""
    sim = sims.start("vllm", "--model", MODEL, *flags, env=env)
    sim.wait_line("init engine (profile, create kv cache, warmup model) took")
    return sim


def compile_seconds(sim: Any) -> float:
    match = re.search(r"torch\.compile took ([\d.]+) s in total", sim.wait_line("torch.compile took"))
    assert match
    return float(match.group(1))


def init_compilation(sim: Any) -> float:
    line = sim.wait_line("init engine (profile, create kv cache, warmup model) took")
    match = re.search(r"\(compilation: ([\d.]+) s\)", line)
    assert match, line
    return float(match.group(1))


def is_warm(sim: Any) -> bool:
    text = sim.text()
    warm = "Directly load the compiled graph(s) for compile range (1, 8192) from the cache, took" in text
    cold = "Compiling a graph for compile range (1, 8192) takes" in text
    assert warm != cold
    return warm


def test_second_start_with_the_same_key_loads_the_compiled_graphs(sims: Any, tmp_path: Any) -> None:
    env = {**V34, "VLLM_CACHE_ROOT": str(tmp_path)}
    first = started(sims, env)
    directory = re.search(r"Using cache directory: (\S+) for vLLM's torch.compile", first.text())
    assert directory and directory.group(1).startswith(os.path.join(str(tmp_path), "torch_compile_cache", ""))
    assert directory.group(1).endswith("/rank_0_0/backbone")
    assert not is_warm(first)
    assert "[backbone] Cache the graph of compile range (1, 8192) for later use" in first.text()
    second = started(sims, env)
    assert is_warm(second)
    assert compile_seconds(second) < compile_seconds(first)
    assert init_compilation(second) < init_compilation(first)
    assert directory.group(1) in second.text()


def test_scheduler_and_graph_flags_change_the_key_memory_flags_do_not(sims: Any, tmp_path: Any) -> None:
    env = {**V34, "VLLM_CACHE_ROOT": str(tmp_path)}
    assert not is_warm(started(sims, env, "--max-num-seqs", "256"))
    assert not is_warm(started(sims, env, "--max-num-seqs", "128"))
    assert not is_warm(started(sims, env, "--max-num-seqs", "256", "--max-cudagraph-capture-size", "128"))
    assert is_warm(started(sims, env, "--max-num-seqs", "256", "--gpu-memory-utilization", "0.8"))
    assert is_warm(started(sims, env, "--max-num-seqs", "256", "--no-enable-prefix-caching"))
    assert is_warm(started(sims, env, "--max-num-seqs", "256", "--kv-cache-memory-bytes", "20G"))


def test_disabled_cache_always_compiles_and_older_releases_keep_their_wording(sims: Any, tmp_path: Any) -> None:
    off = {**V34, "VLLM_CACHE_ROOT": str(tmp_path), "VLLM_DISABLE_COMPILE_CACHE": "1"}
    for _ in range(2):
        sim = started(sims, off)
        assert "[backbone] vLLM's torch.compile cache is disabled." in sim.text()
        assert not is_warm(sim)
    assert not os.path.exists(tmp_path / "torch_compile_cache")
    old = {"AUTOTUNE_SIM_VLLM_VERSION": "0.32.0", "VLLM_CACHE_ROOT": str(tmp_path)}
    started(sims, old)
    again = started(sims, old)
    assert is_warm(again)
    assert "torch.compile takes 5.60 s in total" in again.text()
    assert re.search(r"init engine \(profile, create kv cache, warmup model\) took [\d.]+ seconds$", again.text(), re.M)


def test_eager_starts_compile_nothing(sims: Any, tmp_path: Any) -> None:
    env = {**V34, "VLLM_CACHE_ROOT": str(tmp_path)}
    sim = sims.start("vllm", "--model", MODEL, "--enforce-eager", env=env)
    sim.wait_line("init engine")
    time.sleep(0.1)
    assert "torch.compile" not in sim.text()
    assert not os.path.exists(tmp_path / "torch_compile_cache")
