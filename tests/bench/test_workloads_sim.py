"""Every shipped workload, the capacity search and ``autotune bench`` against the simulated engine.

One simulated vLLM (L4, Llama-3.1-8B, 10× faster than modelled time) serves the whole module.
Workloads keep their shapes (kinds, length distributions, prefixes, turns) with fewer requests,
rates scaled by the speed-up and think times divided by it, so each runs in seconds.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.bench import prometheus
from autotune.bench.capacity import judge, search_capacity
from autotune.bench.loadgen import BenchResult, run_workload_sync
from autotune.cli import app
from autotune.config import Arrival, Workload, load_yaml, parse_model
from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess

pytestmark = [pytest.mark.sim, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SPEEDUP = 10.0


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    argv = [
        sys.executable, "-m", "autotune_sim", "vllm", "--model", "llama-3.1-8b", "--port", str(port),
        "--max-model-len", "24576", "--enable-prefix-caching",
    ]  # fmt: skip
    env = {"AUTOTUNE_SIM_SPEEDUP": str(SPEEDUP), "AUTOTUNE_SIM_GPU": "L4", "VLLM_SERVER_DEV_MODE": "1"}
    base = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("sim") / "engine.log"
    with EngineProcess(argv, env, log, ready_url=base + "/health", startup_timeout_s=120) as engine:
        engine.wait_ready()
        yield base


def shipped(name: str, sessions: int) -> Workload:
    """A shipped workload with fewer sessions, its rate scaled by the speed-up."""
    w = load_yaml(ROOT / "workloads" / f"{name}.yaml", Workload)
    rate = w.arrival.request_rate * SPEEDUP if math.isfinite(w.arrival.request_rate) else math.inf
    dataset = w.dataset.model_copy(update={"think_time_s": w.dataset.think_time_s / SPEEDUP})
    return w.model_copy(
        update={
            "num_prompts": sessions,
            "warmup_requests": min(w.warmup_requests, 8),
            "arrival": w.arrival.model_copy(update={"request_rate": rate}),
            "dataset": dataset,
        }
    )


def run(base: str, w: Workload) -> tuple[BenchResult, float]:
    """The run and the engine's prefix-cache hits (tokens) during it."""
    before = prometheus.scrape(base)
    result = run_workload_sync(base, w, workers=1)
    hits = prometheus.delta(before, prometheus.scrape(base), "vllm:prefix_cache_hits")
    return result, hits


@pytest.mark.parametrize(
    ("name", "sessions"),
    [("chat", 24), ("offline-batch", 24), ("long-context", 6), ("custom", 12), ("cpu-quick", 16)],
)
def test_shipped_workload_runs(sim: str, name: str, sessions: int) -> None:
    w = shipped(name, sessions)
    result, _ = run(sim, w)
    m = result.metrics
    assert m["failed"] == 0 and m["completed"] == len(result.records) >= sessions
    assert result.prefix_cache_reset == "/reset_prefix_cache"
    assert result.clamped_requests == 0 and result.prompt_len_mismatches == 0
    if w.dataset.kind == "random":
        d = w.dataset
        assert all(d.input_dist.low <= r.prompt_len - d.prefix_len for r in result.records)
        assert max(r.prompt_len + r.output_tokens for r in result.records) <= w.longest_request_tokens


def test_rag_prefix_hits_the_engines_prefix_cache(sim: str) -> None:
    w = shipped("rag-prefix", 32)
    result, hits = run(sim, w)
    assert result.metrics["failed"] == 0
    # Every measured request reuses a prefix the warm-up cached: at least most of 2048 tokens each.
    assert hits >= 32 * 1024
    no_prefix = w.model_copy(update={"dataset": w.dataset.model_copy(update={"prefix_len": 0, "num_prefixes": 1})})
    _, cold_hits = run(sim, no_prefix)
    assert cold_hits < hits / 10


def test_multi_turn_history_grows_turn_by_turn(sim: str) -> None:
    w = shipped("multi-turn", 8)
    result, hits = run(sim, w)
    assert result.metrics["failed"] == 0
    sessions: dict[int, list[int]] = {}
    for r in result.records:
        sessions.setdefault(r.session, []).append(r.prompt_len)
    assert len(sessions) == 8 and all(2 <= len(p) <= 6 for p in sessions.values())
    assert all(a < b for p in sessions.values() for a, b in itertools.pairwise(p))
    assert hits > 0  # later turns find their history in the prefix cache


def test_capacity_search_finds_the_edge(sim: str) -> None:
    w = parse_model(
        Workload,
        {
            "name": "capacity",
            "num_prompts": 60,
            "warmup_requests": 2,
            "dataset": {"input_len": 1024, "output_len": 64},
            # A 1024-token prefill alone takes ~170 modelled ms on the simulated L4.
            "slos": {"p50_ttft_ms": 400},
            "capacity": {"start": 2, "rel_tol": 0.25, "max_runs": 9, "seconds_per_run": 3.0},
        },
        "test",
    )
    found = search_capacity(sim, w, workers=1)
    assert found.stop_reason == "converged" and found.next_step_failed
    assert found.upper is not None and found.value < found.upper <= found.value * 1.25 + 1e-9

    def rerun(rate: float) -> dict[str, float]:
        at = w.model_copy(update={"arrival": Arrival(request_rate=rate), "num_prompts": max(20, math.ceil(rate * 3))})
        return judge(run_workload_sync(sim, at, workers=1), w)

    # Near the edge a level passes or fails by chance (TTFT at high utilisation on a shared
    # machine); the level found held twice in the search, so one more pass in two tries is
    # expected, and likewise one failure in two tries one step up.
    assert any(not rerun(found.value) for _ in range(2))
    assert any(rerun(found.upper) for _ in range(2))


def test_cli_bench_prints_and_saves_vllm_keys(sim: str, tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text("num_prompts: 6\nwarmup_requests: 1\ndataset: {input_len: 64, output_len: 8}\n")
    out = tmp_path / "out.json"
    result = CliRunner().invoke(app, ["bench", "--url", sim, "--workload", str(workload), "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert "output throughput tok/s" in result.output
    data = json.loads(out.read_text())
    assert data["completed"] == 6 and {"output_throughput", "p99_ttft_ms", "ttfts", "itls"} <= set(data)


def test_cli_bench_capacity(sim: str, tmp_path: Path) -> None:
    workload = tmp_path / "w.yaml"
    workload.write_text(
        "num_prompts: 12\nwarmup_requests: 1\ndataset: {input_len: 64, output_len: 8}\n"
        "slos: {p95_ttft_ms: 60000}\ncapacity: {start: 20, high: 40, max_runs: 3}\n"
    )
    out = tmp_path / "cap.json"
    result = CliRunner().invoke(
        app, ["bench", "--url", sim, "--workload", str(workload), "--capacity", "--output", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "highest load meeting the SLOs: 40.00 req/s (at_high)" in result.output
    assert [r["level"] for r in json.loads(out.read_text())["runs"]] == [20, 40]
