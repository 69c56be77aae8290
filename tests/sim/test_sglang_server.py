"""The SGLang dialect as a real server process: log lines, readiness, endpoints, metrics, failures."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.sim, pytest.mark.slow]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LINE = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d( TP0)?\] ")
OLD = {"AUTOTUNE_SIM_SGLANG_VERSION": "0.5.9"}


def post(sim: Any, path: str, payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(sim.url + path, json=payload, timeout=30.0, trust_env=False)


def get(sim: Any, path: str) -> httpx.Response:
    return httpx.get(sim.url + path, timeout=30.0, trust_env=False)


def test_startup_lines_in_order_then_ready(sims: Any) -> None:
    sim = sims.ready("sglang", "--model-path", MODEL)
    expected = [
        "server_args={",
        "modelled by autotune's simulator",
        "Load weight begin. avail mem=",
        "Load weight end. elapsed=",
        "KV Cache is allocated. dtype: torch.bfloat16, #tokens: ",
        "Capture target prefill CUDA graph begin. backend=breakable",
        "Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 12, 16, 24",
        "max_total_num_tokens=",
        "Uvicorn running on",
        "Prefill batch, #new-seq: 1,",
        "The server is fired up and ready to roll!",
    ]
    sim.wait_line("fired up")
    lines = list(sim.lines)
    positions = [next(i for i, line in enumerate(lines) if needle in line) for needle in expected]
    assert positions == sorted(positions)
    summary = next(line for line in lines if "max_total_num_tokens=" in line)
    assert LINE.match(summary)
    assert re.search(
        r"max_total_num_tokens=\d+, chunked_prefill_size=8192, max_prefill_tokens=16384, "
        r"max_running_requests=\d+, context_len=131072, available_gpu_mem=\d+\.\d\d GB$",
        summary,
    )
    args = next(line for line in lines if "server_args=" in line)
    assert "'mem_fraction_static': 0.83" in args and "'cuda_graph_config': {'decode': {'backend': 'full'" in args
    assert get(sim, "/health").status_code == 200
    assert get(sim, "/v1/models").json()["data"][0]["owned_by"] == "sglang"


def test_tp_ranks_prefix_the_scheduler_lines(sims: Any) -> None:
    sim = sims.ready("sglang", "--model-path", MODEL, "--tp-size", "2")
    assert LINE.match(sim.wait_line("KV Cache is allocated")) and " TP0] KV Cache" in sim.wait_line("KV Cache")


def test_server_info_tokenize_and_detokenize(sims: Any) -> None:
    sim = sims.ready("sglang", "--model-path", MODEL, "--mem-fraction-static", "0.8", "--max-running-requests", "64")
    info = get(sim, "/server_info").json()
    assert info["mem_fraction_static"] == 0.8 and info["max_total_num_tokens"] > 0
    assert info["internal_states"][0]["effective_max_running_requests_per_dp"] == 64
    counted = post(sim, "/tokenize", {"prompt": "a short prompt"}).json()
    assert counted["count"] == len(counted["tokens"])
    assert post(sim, "/detokenize", {"tokens": counted["tokens"]}).json() == {"text": "a short prompt"}
    done = post(sim, "/v1/completions", {"prompt": "a short prompt", "max_tokens": 3, "ignore_eos": True}).json()
    assert done["usage"]["prompt_tokens"] == counted["count"] and done["usage"]["completion_tokens"] == 3


def test_too_long_request_is_rejected_not_clamped(sims: Any) -> None:
    sim = sims.ready("sglang", "--model-path", MODEL, "--context-length", "256")
    resp = post(sim, "/v1/completions", {"prompt": list(range(300, 500)), "max_tokens": 100})
    assert resp.status_code == 400 and "maximum context length of 256" in resp.json()["message"]


def test_metrics_only_with_enable_metrics(sims: Any) -> None:
    plain = sims.ready("sglang", "--model-path", MODEL)
    assert get(plain, "/metrics").status_code == 404
    sim = sims.ready("sglang", "--model-path", MODEL, "--enable-metrics")
    post(sim, "/v1/completions", {"prompt": "hello", "max_tokens": 4, "ignore_eos": True})
    names = {line.split("{")[0] for line in get(sim, "/metrics").text.splitlines() if not line.startswith("#")}
    for name in (
        "sglang:num_retracted_requests_total",
        "sglang:token_usage",
        "sglang:cache_hit_rate",
        "sglang:num_queue_reqs",
        "sglang:generation_tokens_total",
        "sglang:time_to_first_token_seconds_bucket",
    ):
        assert name in names


def test_decode_lines_and_retraction_warnings_under_a_tight_pool(sims: Any) -> None:
    sim = sims.ready(
        "sglang",
        "--model-path",
        MODEL,
        # 500 tokens: any 2 of the 24 requests (264 tokens each at their end) overflow it, so the
        # pool fills even when a starved client's requests arrive spread out (on a loaded 2-core
        # host, 2,000 tokens once saw no more than 5 running at a time, and no retraction).
        "--max-total-tokens",
        "500",
        "--schedule-conservativeness",
        "0.05",
        "--decode-log-interval",
        "10",
        "--enable-metrics",
    )

    async def load() -> list[int]:
        async with httpx.AsyncClient(timeout=60.0, trust_env=False) as client:

            async def one(i: int) -> int:
                body = {"prompt": list(range(300 + 50 * i, 364 + 50 * i)), "max_tokens": 200, "ignore_eos": True}
                resp = await client.post(sim.url + "/v1/completions", json=body)
                return int(resp.json()["usage"]["completion_tokens"])

            return await asyncio.gather(*[one(i) for i in range(24)])

    assert asyncio.run(load()) == [200] * 24  # retracted requests are recomputed, never lost
    decode = sim.wait_line("Decode batch, #running-req:")
    assert re.search(
        r"Decode batch, #running-req: \d+, #token: \d+, token usage: \d\.\d\d, cuda graph: (True|False), "
        r"gen throughput \(token/s\): \d+\.\d\d, #queue-req: \d+$",
        decode,
    )
    retract = sim.wait_line("KV cache pool is full. Retract requests.")
    assert re.search(
        r"#retracted_reqs: \d+, #new_tokens_gained: \d+, #new_token_ratio: \d\.\d{4} -> \d\.\d{4}$", retract
    )
    metrics = get(sim, "/metrics").text
    total = re.search(r"^sglang:num_retracted_requests_total\{.*\} (\S+)$", metrics, re.M)
    assert total and float(total.group(1)) > 0


def test_removed_graph_flag_is_ambiguous_on_new_and_current_on_old(sims: Any) -> None:
    new = sims.exited("sglang", "--model-path", MODEL, "--cuda-graph-max-bs", "128")
    assert new.proc.returncode == 2
    assert (
        "ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
        in new.text()
    )
    old = sims.ready("sglang", "--model-path", MODEL, "--cuda-graph-max-bs", "128", env=OLD)
    capture = old.wait_line("Capture cuda graph end. Time elapsed:")
    assert re.search(r"mem usage=\d+\.\d\d GB\. avail mem=\d+\.\d\d GB\.$", capture)
    assert "server_args=ServerArgs(" in old.wait_line("server_args=")


def test_help_is_argparse_with_the_new_flags(sims: Any) -> None:
    from autotune.engines.base import parse_help_flags

    flags = parse_help_flags("\n".join(sims.exited("sglang", "--help").lines))
    assert {"--cuda-graph-max-bs-decode", "--mem-fraction-static", "--schedule-conservativeness"} <= flags
    assert "--cuda-graph-max-bs" not in flags
    old = parse_help_flags("\n".join(sims.exited("sglang", "--help", env=OLD).lines))
    assert "--cuda-graph-max-bs" in old and "--cuda-graph-max-bs-decode" not in old


@pytest.mark.parametrize(
    ("fraction", "message"),
    [
        ("0.15", "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.15"),
        ("0.995", "Capture"),
    ],
)
def test_startup_memory_failures_kill_the_tree(sims: Any, fraction: str, message: str) -> None:
    sim = sims.exited(
        "sglang", "--model-path", MODEL, "--mem-fraction-static", fraction, "--cuda-graph-max-bs-decode", "1024"
    )
    text = sim.text()
    assert sim.proc.returncode == -9  # the launcher SIGKILLs its own tree after a scheduler failure
    assert "Scheduler hit an exception" in text and message in text
    assert "Received sigquit from a child process. It usually means the child failed." in text


def test_runtime_oom_under_a_large_prefill_batch(sims: Any) -> None:
    sim = sims.ready("sglang", "--model-path", MODEL, "--mem-fraction-static", "0.94")
    assert post(sim, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "ignore_eos": True}).status_code == 200
    with pytest.raises(httpx.HTTPError):
        post(sim, "/v1/completions", {"prompt": list(range(300, 8300)), "max_tokens": 2})
    assert sim.wait_exit() == -9
    text = sim.text()
    assert "torch.OutOfMemoryError: CUDA out of memory" in text and "SIGQUIT received" in text


def test_unknown_model_exits_1(sims: Any) -> None:
    sim = sims.exited("sglang", "--model-path", "org/missing")
    assert sim.proc.returncode == 1 and "is not a local folder and is not a valid model identifier" in sim.text()


def test_stream_chunks_and_usage(sims: Any) -> None:
    sim = sims.ready("sglang", "--model-path", MODEL)
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = [
        line[6:] for line in post(sim, "/v1/chat/completions", body).text.splitlines() if line.startswith("data: ")
    ]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    assert parsed[0]["choices"][0]["delta"]["role"] == "assistant"
    assert parsed[-1]["choices"] == [] and parsed[-1]["usage"]["completion_tokens"] == 3


def test_injected_crash_kills_the_tree(sims: Any) -> None:
    sim = sims.ready("sglang", "--model-path", MODEL, env={"AUTOTUNE_SIM_FAULT": "crash_after_requests=1"})
    with pytest.raises(httpx.HTTPError):
        post(sim, "/v1/completions", {"prompt": "x", "max_tokens": 20})
    assert sim.wait_exit() == -9 and "Scheduler hit an exception" in sim.text()
