"""SglangAdapter against the simulator's SGLang dialect, old (0.5.9) and new (0.5.23) flag sets.

The simulator is launched exactly as a real SGLang would be: ``build_launch`` gives the argv, a
plain subprocess runs it in its own session, and the process group is killed in ``finally``.
Checked: flag discovery from the simulator's real ``--help``, readiness on the adapter's path,
the KV-capacity event, ``/server_info``, the ``/metrics`` keys the facts use, version drift as
argparse reports it, and both kinds of memory failure at start-up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

import autotune_sim
from autotune.bench import prometheus
from autotune.config import EngineSettings
from autotune.engines.base import EventKind, LaunchSpec, LogEvent
from autotune.engines.sglang import SglangAdapter
from autotune.errors import InvalidFlags
from autotune.outcomes import Outcome
from autotune.runtime.ports import free_port

SIM_MAIN = Path(autotune_sim.__file__).parent / "__main__.py"
pytestmark = [
    pytest.mark.sim,
    pytest.mark.slow,
    pytest.mark.skipif(not SIM_MAIN.exists(), reason="the simulator (autotune_sim/__main__.py) is not there yet"),
]

OLD, NEW = "0.5.9", "0.5.23"
MODEL = "Qwen/Qwen2.5-7B-Instruct"
READY_TIMEOUT_S = 90.0
SIM_ENV = {"AUTOTUNE_SIM_GPU": "H100-80GB", "AUTOTUNE_SIM_SPEEDUP": "200"}


def sim_adapter(version: str, model: str = MODEL) -> SglangAdapter:
    env = {**SIM_ENV, "AUTOTUNE_SIM_SGLANG_VERSION": version}
    command = [sys.executable, "-m", "autotune_sim", "sglang"]
    return SglangAdapter(EngineSettings(kind="sglang", model=model, command=command, env=env, simulated=True))


@pytest.fixture(params=[OLD, NEW])
def version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@dataclass
class Engine:
    """One simulated SGLang process and the events its output produced."""

    spec: LaunchSpec
    proc: subprocess.Popen[str]
    adapter: SglangAdapter
    lines: list[str] = field(default_factory=list)
    events: list[LogEvent] = field(default_factory=list)

    def read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self.lines.append(line)
            event = self.adapter.parse_log_line(line)
            if event is not None:
                self.events.append(event)

    def wait_ready(self) -> None:
        url = self.spec.base_url + self.spec.ready_path
        deadline = time.monotonic() + READY_TIMEOUT_S
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                assert self.proc.poll() is None, f"engine exited ({self.proc.returncode}): {self.lines[-5:]}"
                with contextlib.suppress(httpx.HTTPError):
                    status = client.get(url).status_code
                    if status == 200:
                        return
                    if status == 404 and self.spec.ready_fallback:  # a release without /ready
                        url = self.spec.base_url + self.spec.ready_fallback
                time.sleep(0.1)
        pytest.fail(f"not ready on {self.spec.ready_path} in {READY_TIMEOUT_S:.0f}s: {self.lines[-5:]}")

    def kinds(self) -> list[EventKind]:
        return [e.kind for e in self.events]


@contextlib.contextmanager
def running(adapter: SglangAdapter, params: dict[str, object]) -> Iterator[Engine]:
    flags = adapter.to_flags(params)
    adapter.validate_flags(flags)
    spec = adapter.build_launch(flags, free_port(adapter.settings.host))
    proc = subprocess.Popen(
        spec.argv,
        env={**os.environ, **spec.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    engine = Engine(spec, proc, adapter)
    reader = threading.Thread(target=engine.read, daemon=True)
    reader.start()
    try:
        yield engine
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        reader.join(timeout=10)


def run_to_exit(adapter: SglangAdapter, argv: list[str], timeout_s: float = 60.0) -> tuple[int, list[LogEvent]]:
    """Run a launch that is expected to fail; its return code and the events of its output."""
    proc = subprocess.Popen(
        argv,
        env={**os.environ, **adapter.settings.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    events = [e for e in map(adapter.parse_log_line, out.splitlines()) if e is not None]
    return proc.returncode, events


# --------------------------------------------------------------------------- flag discovery
@pytest.mark.parametrize(("ver", "flag"), [(OLD, "--cuda-graph-max-bs"), (NEW, "--cuda-graph-max-bs-decode")])
def test_sim_help_is_the_dialects_flag_set(ver: str, flag: str) -> None:
    adapter = sim_adapter(ver)
    known = adapter.discover_flags()
    assert adapter.to_flags({"cuda_graph_max_bs": 512}) == {flag: 512}
    needed = {"--mem-fraction-static", "--schedule-conservativeness", "--chunked-prefill-size", "--enable-metrics"}
    assert needed <= known.flags


# ------------------------------------------------------------------------------ serving
def test_sim_serves_ready_kv_event_server_info_and_metrics(version: str) -> None:
    adapter = sim_adapter(version)
    with running(adapter, {"memory_fraction": 0.85, "cuda_graph_max_bs": 256}) as engine:
        engine.wait_ready()
        before = prometheus.scrape(engine.spec.base_url)
        with httpx.Client(timeout=60.0, trust_env=False) as client:
            for _ in range(8):
                body = {"model": MODEL, "prompt": "hello " * 64, "max_tokens": 64, "ignore_eos": True}
                resp = client.post(engine.spec.base_url + "/v1/completions", json=body)
                assert resp.status_code == 200
        info = adapter.resolved_args(engine.spec.base_url)
        after = prometheus.scrape(engine.spec.base_url)
        time.sleep(0.2)  # let the reader catch up with the last log lines
        events = list(engine.events)

    assert EventKind.READY in [e.kind for e in events]
    kv = [e for e in events if e.kind == EventKind.KV_CAPACITY and e.data.get("source") == "scheduler"]
    assert kv and kv[-1].data["kv_tokens"] > 0 and kv[-1].data["max_concurrency"] > 0
    assert kv[-1].data["headroom_gib"] >= 0

    assert info["mem_fraction_static"] == pytest.approx(0.85)

    names = {prometheus.split_key(key)[0] for key in after}
    for metric in (
        "sglang:num_retracted_requests_total",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:num_queue_reqs",
    ):
        assert metric in names, f"{metric} missing from /metrics"

    facts = adapter.engine_facts(events, before, after)
    assert facts["kv_tokens"] == kv[-1].data["kv_tokens"]
    assert facts["preemptions"] == facts["retractions"] >= 0
    assert "headroom_gib" in facts and "max_concurrency" in facts


# --------------------------------------------------------------------------- version drift
def test_sim_new_dialect_rejects_the_removed_flag_like_sglang() -> None:
    adapter = sim_adapter(NEW)
    with pytest.raises(
        InvalidFlags,
        match=r"renamed to `--cuda-graph-max-bs-decode` in SGLang 0\.5\.15, and the old spelling removed in 0\.5\.20",
    ):
        adapter.to_flags({"--cuda-graph-max-bs": 256})
    # Bypassing the adapter shows what the check saves: argparse's ambiguous-prefix exit.
    argv = [*adapter.launch_prefix(), "--model-path", MODEL, "--cuda-graph-max-bs", "256"]
    code, events = run_to_exit(adapter, argv)
    assert code == 2
    invalid = [e for e in events if e.kind == EventKind.INVALID_ARGS]
    assert invalid and invalid[0].data.get("renamed_to") == "--cuda-graph-max-bs-decode"
    assert adapter.classify_failure(code, events) == Outcome.INVALID_FLAGS


# ------------------------------------------------------------------------- memory failures
@pytest.mark.parametrize(
    ("params", "outcome", "direction"),
    [
        ({"memory_fraction": 0.1}, Outcome.KV_INSUFFICIENT, "too_low"),
        ({"memory_fraction": 0.99, "cuda_graph_max_bs": 1024}, Outcome.OOM_STARTUP, "too_high"),
    ],
)
def test_sim_memory_failures_are_classified_by_direction(
    version: str, params: dict[str, object], outcome: Outcome, direction: str
) -> None:
    adapter = sim_adapter(version)
    spec = adapter.build_launch(adapter.to_flags(params), free_port(adapter.settings.host))
    code, events = run_to_exit(adapter, spec.argv)
    assert code != 0
    assert adapter.classify_failure(code, events) == outcome
    memory = [e for e in events if "memory_direction" in e.data]
    assert memory and memory[0].data["memory_direction"] == direction
