"""The vLLM adapter, unchanged, against the simulator's vLLM dialect: the real-engine checks.

Flag discovery from ``--help=all``, the launch the adapter builds, readiness on ``/health``, the
events its log parser finds, the facts it reads from ``/metrics`` (preemptions included), and the
classification of failed starts in both memory directions.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from typing import Any

import httpx
import pytest

from autotune.bench import prometheus
from autotune.config import EngineSettings
from autotune.engines.base import EventKind
from autotune.engines.vllm import VllmAdapter
from autotune.outcomes import Outcome

pytestmark = [pytest.mark.sim, pytest.mark.slow]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ENV = {"AUTOTUNE_SIM_SPEEDUP": "500", "AUTOTUNE_SIM_GPU": "H100-80GB"}


def adapter(**env: str) -> VllmAdapter:
    command = [sys.executable, "-m", "autotune_sim", "vllm"]
    return VllmAdapter(EngineSettings(kind="vllm", model=MODEL, command=command, env={**ENV, **env}, simulated=True))


def launch_flags(a: VllmAdapter, params: dict[str, object]) -> list[str]:
    flags = a.to_flags(params)
    a.validate_flags(flags)
    spec = a.build_launch(flags, 0)
    prefix = len(a.launch_prefix())
    argv = spec.argv[prefix:]
    cut = argv.index("--port")  # the fixture picks the port
    return argv[:cut] + argv[cut + 2 :]


def events_of(a: VllmAdapter, lines: list[str]) -> list[Any]:
    return [e for e in map(a.parse_log_line, lines) if e is not None]


def test_flag_discovery_finds_the_knobs() -> None:
    a = adapter()
    known = a.discover_flags()
    for knob in ("memory_fraction", "max_running", "batched_tokens", "context_len", "cuda_graph_max_bs"):
        assert a.knobs[knob] in known.flags
    assert {"--enable-prefix-caching", "--no-enable-prefix-caching", "--enforce-eager"} <= known.flags


def test_served_trial_gives_events_and_facts(sims: Any) -> None:
    a = adapter()
    params = {"memory_fraction": 0.9, "max_running": 16, "batched_tokens": 2048, "context_len": 2048}
    sim = sims.ready("vllm", *launch_flags(a, params), env=ENV)
    before = prometheus.scrape(sim.url)
    with httpx.Client(timeout=60.0, trust_env=False) as client:
        for i in range(4):
            body = {"model": MODEL, "prompt": list(range(300 + i, 812 + i)), "max_tokens": 32, "ignore_eos": True}
            assert client.post(sim.url + "/v1/completions", json=body).status_code == 200
    after = prometheus.scrape(sim.url)
    # The reader thread hands lines over asynchronously: wait for the events, not for a guessed
    # moment (the deadline only bounds a run where they never come).
    wanted = {EventKind.VERSION, EventKind.NON_DEFAULT_ARGS, EventKind.KV_CAPACITY, EventKind.GRAPH_CAPTURE}
    wanted.add(EventKind.READY)
    deadline = time.monotonic() + 30
    while not wanted <= {e.kind for e in events_of(a, list(sim.lines))} and time.monotonic() < deadline:
        time.sleep(0.02)
    events = events_of(a, list(sim.lines))
    kinds = [e.kind for e in events]
    for kind in wanted:
        assert kind in kinds, kind
    facts = a.engine_facts(events, before, after)
    assert facts["kv_tokens"] > 0 and facts["context_len"] == 2048
    assert facts["generation_tokens"] == 4 * 32 and facts["preemptions"] == 0
    assert facts["num_gpu_blocks"] * facts["block_size"] == facts["kv_cache_size_tokens"]
    assert facts["non_default_args"]["max_num_seqs"] == 16


def _burst(port: int, bodies: list[dict[str, Any]], timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """POST every body to /v1/completions so that all of them arrive at once.

    Each request goes out on its own connection minus its last byte (the server cannot start a
    request whose body is incomplete), then the last bytes go out back to back. The requests
    therefore overlap at the engine by construction, not because the client happened to be
    fast enough on a loaded machine.
    """
    pending = []
    for body in bodies:
        data = json.dumps(body).encode()
        head = (
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
        ).encode()
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)
        sock.sendall(head + data[:-1])
        pending.append((sock, data[-1:]))
    for sock, last in pending:
        sock.sendall(last)
    answers = []
    for sock, _ in pending:
        with sock:
            raw = b""
            while chunk := sock.recv(65536):
                raw += chunk
        head_part, _, body_part = raw.partition(b"\r\n\r\n")
        assert head_part.startswith(b"HTTP/1.1 200"), head_part[:200]
        answers.append(json.loads(body_part))
    return answers


def test_preemptions_reach_the_facts(sims: Any) -> None:
    a = adapter()
    flags = launch_flags(a, {"max_running": 64, "context_len": 1024})
    # 3,200 tokens of KV for 16 requests of 256 + 256 tokens that arrive together (_burst): the
    # pool runs out while they decode, so some must be preempted and recomputed.
    slower = {**ENV, "AUTOTUNE_SIM_SPEEDUP": "20"}
    sim = sims.ready("vllm", *flags, "--num-gpu-blocks-override", "200", env=slower)
    before = prometheus.scrape(sim.url)
    bodies = [
        {"prompt": list(range(300 + 7 * i, 556 + 7 * i)), "max_tokens": 256, "ignore_eos": True} for i in range(16)
    ]
    answers = _burst(sim.port, bodies)
    # preempted requests are recomputed, never lost
    assert [int(r["usage"]["completion_tokens"]) for r in answers] == [256] * 16
    facts = a.engine_facts(events_of(a, list(sim.lines)), before, prometheus.scrape(sim.url))
    assert facts["preemptions"] > 0


@pytest.mark.parametrize(
    ("params", "outcome"),
    [
        ({"memory_fraction": 0.3}, Outcome.KV_INSUFFICIENT),
        ({"memory_fraction": 1.0}, Outcome.OOM_STARTUP),
        ({"memory_fraction": 1.5}, Outcome.INVALID_FLAGS),
    ],
)
def test_failed_starts_are_classified(sims: Any, params: dict[str, object], outcome: Outcome) -> None:
    a = adapter()
    sim = sims.exited("vllm", *launch_flags(a, params), env=ENV)
    assert sim.proc.returncode != 0
    assert a.classify_failure(sim.proc.returncode, events_of(a, list(sim.lines))) == outcome
