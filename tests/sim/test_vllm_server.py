"""The vLLM dialect as a real server process: log lines, endpoints, streaming, metrics, failures."""

from __future__ import annotations

import asyncio
import json
import re
import signal
import socket
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.sim, pytest.mark.slow]

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LINE = re.compile(
    r"^\((APIServer|EngineCore_DP0|Worker_TP\d+) pid=\d+\) (INFO|WARNING|ERROR) "
    r"\d\d-\d\d \d\d:\d\d:\d\d \[[\w.]+:\d+\] "
)


def sse(body: str) -> list[Any]:
    events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def post(sim: Any, path: str, payload: dict[str, Any]) -> httpx.Response:
    return httpx.post(sim.url + path, json=payload, timeout=30.0, trust_env=False)


# --------------------------------------------------------------------------------- start-up
def test_startup_prints_vllms_lines_in_order_and_serves_health(sims: Any) -> None:
    sim = sims.ready("vllm", "--model", MODEL, "--max-num-seqs", "64")
    expected = [
        "vLLM server version 0.32.0, serving model " + MODEL,
        "modelled by autotune's simulator",
        "non-default args: {",
        "Using max model len 131072",
        "Chunked prefill is enabled with max_num_batched_tokens=8192.",
        "Initializing a V1 LLM engine (v0.32.0) with config:",
        "Model loading took 14.99 GiB memory",
        "Available KV cache memory:",
        "GPU KV cache size:",
        "Graph capturing finished in",
        f"Starting vLLM server on http://127.0.0.1:{sim.port}",
        "Application startup complete.",
    ]
    sim.wait_line("Application startup complete.")
    lines = list(sim.lines)
    positions = [next(i for i, line in enumerate(lines) if needle in line) for needle in expected]
    assert positions == sorted(positions)
    kv = next(line for line in lines if "GPU KV cache size:" in line)
    assert re.search(
        r"GPU KV cache size: \d{1,3}(,\d{3})+ tokens, Maximum concurrency for 131,072 tokens per "
        r"request: \d+\.\d\dx$",
        kv,
    )
    assert LINE.match(kv)
    assert "'max_num_seqs': 64" in next(line for line in lines if "non-default args" in line)
    assert httpx.get(sim.url + "/health", trust_env=False).status_code == 200
    assert httpx.get(sim.url + "/version", trust_env=False).json() == {"version": "0.32.0"}
    models = httpx.get(sim.url + "/v1/models", trust_env=False).json()
    assert models["data"][0]["id"] == MODEL and models["data"][0]["max_model_len"] == 131072


# ----------------------------------------------------------------------------------- tokens
def test_tokenize_counts_match_usage_and_ignore_eos_gives_exact_lengths(sims: Any) -> None:
    sim = sims.ready("vllm", "--model", MODEL, "--max-model-len", "128")
    text = "Tell me a story about a tuner that never sleeps."
    counted = post(sim, "/tokenize", {"prompt": text}).json()
    assert counted["count"] == len(counted["tokens"]) and counted["max_model_len"] == 128
    done = post(sim, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 7, "ignore_eos": True}).json()
    assert done["usage"] == {
        "prompt_tokens": counted["count"],
        "total_tokens": counted["count"] + 7,
        "completion_tokens": 7,
    }
    assert done["choices"][0]["finish_reason"] == "length"
    assert post(sim, "/detokenize", {"tokens": counted["tokens"]}).json()["prompt"] == text
    ids = list(range(500, 600))
    clamped = post(sim, "/v1/completions", {"prompt": ids, "max_tokens": 50, "ignore_eos": True}).json()
    assert clamped["usage"]["prompt_tokens"] == 100 and clamped["usage"]["completion_tokens"] == 28  # 128 − 100
    too_long = post(sim, "/v1/completions", {"prompt": ids, "max_tokens": 200})
    assert too_long.status_code == 400 and "maximum context length is 128" in too_long.json()["error"]["message"]
    wrong = post(sim, "/v1/completions", {"model": "other", "prompt": "x"})
    assert wrong.status_code == 404


def test_streams_completion_and_chat_chunks_with_usage(sims: Any) -> None:
    sim = sims.ready("vllm", "--model", MODEL)
    body = {
        "prompt": "hello",
        "max_tokens": 5,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse(post(sim, "/v1/completions", body).text)
    assert events[-1] == "[DONE]"
    tokens = [e for e in events[:-1] if e["choices"]]
    assert len(tokens) == 5 and all(e["object"] == "text_completion" for e in tokens)
    assert [e["choices"][0]["finish_reason"] for e in tokens] == [None] * 4 + ["length"]
    assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == 5
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "ignore_eos": True, "stream": True}
    events = sse(post(sim, "/v1/chat/completions", chat).text)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [e["choices"][0]["delta"].get("content") is not None for e in events[1:-1]] == [True] * 3
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"


def test_many_concurrent_streams_on_one_keep_alive_pool(sims: Any) -> None:
    sim = sims.ready("vllm", "--model", MODEL)

    async def main() -> list[int]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=60.0, limits=limits, trust_env=False) as client:

            async def one(i: int) -> int:
                body = {
                    "prompt": list(range(300 + i, 428 + i)),
                    "max_tokens": 24,
                    "ignore_eos": True,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                }
                async with client.stream("POST", sim.url + "/v1/completions", json=body) as resp:
                    text = "".join([chunk async for chunk in resp.aiter_text()])
                return int(sse(text)[-2]["usage"]["completion_tokens"])

            first = await asyncio.gather(*[one(i) for i in range(150)])
            again = await asyncio.gather(*[one(i) for i in range(150)])  # connections are reused
            return first + again

    assert asyncio.run(main()) == [24] * 300


def test_metrics_have_vllms_names_and_count_the_work(sims: Any) -> None:
    sim = sims.ready("vllm", "--model", MODEL)
    for _ in range(2):
        post(sim, "/v1/completions", {"prompt": list(range(1000, 1400)), "max_tokens": 10, "ignore_eos": True})
    text = httpx.get(sim.url + "/metrics", trust_env=False).text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines() if line and line[0] != "#"}
    labels = f'{{model_name="{MODEL}",engine="0"}}'
    assert values["vllm:generation_tokens_total" + labels] == 20
    assert values["vllm:prompt_tokens_total" + labels] == 800
    assert values["vllm:prefix_cache_hits_total" + labels] > 0  # the second prompt repeats the first
    assert values["vllm:num_preemptions_total" + labels] == 0
    for name in ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting"):
        assert name + labels in values
    assert any(k.startswith("vllm:time_to_first_token_seconds_bucket") for k in values)
    assert re.search(r'vllm:cache_config_info\{.*num_gpu_blocks="\d+".*\} 1\.0', text)
    quiet = sims.ready("vllm", "--model", MODEL, "--disable-log-stats")
    assert "vllm:" not in httpx.get(quiet.url + "/metrics", trust_env=False).text


# -------------------------------------------------------------------------------- argv & help
def test_help_lists_every_flag_argparse_style(sims: Any) -> None:
    from autotune.engines.base import parse_help_flags

    flags = parse_help_flags("\n".join(sims.exited("vllm", "--help=all").lines))
    assert {
        "--max-num-seqs",
        "--gpu-memory-utilization",
        "--max-cudagraph-capture-size",
        "--enable-prefix-caching",
        "--no-enable-prefix-caching",
        "--enforce-eager",
    } <= flags
    newer = parse_help_flags(
        "\n".join(sims.exited("vllm", "--help", env={"AUTOTUNE_SIM_VLLM_VERSION": "0.33.0"}).lines)
    )
    assert "--disable-prefix-caching" in newer and "--no-enable-prefix-caching" not in newer
    cache_only = parse_help_flags("\n".join(sims.exited("vllm", "--help=CacheConfig").lines))
    assert "--block-size" in cache_only and "--max-num-seqs" not in cache_only


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--swap-space", "4"], "unrecognized arguments: --swap-space"),
        (["--device", "cuda"], "ambiguous option: --device"),
        (["--enable-chunked-prefill", "false"], "unrecognized arguments: false"),  # booleans take no value
    ],
)
def test_unknown_flags_are_usage_errors(sims: Any, flags: list[str], message: str) -> None:
    sim = sims.exited("vllm", MODEL, *flags)  # `vllm serve MODEL ...`: the model is the positional
    assert sim.proc.returncode == 2 and message in sim.text()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--gpu-memory-utilization", "1.5"], "Input should be less than or equal to 1"),
        (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"], "must be greater than or equal to max_num_seqs"),
        (["--max-model-len", "200k"], "is greater than the derived max_model_len"),
        (["-tp", "16"], "World size (16) is larger than the number of available GPUs (8)"),
    ],
)
def test_invalid_values_exit_1_with_vllms_message(sims: Any, flags: list[str], message: str) -> None:
    sim = sims.exited("vllm", "--model", MODEL, *flags)
    assert sim.proc.returncode == 1 and message in sim.text()


def test_unknown_model_fails_like_a_missing_model(sims: Any) -> None:
    sim = sims.exited("vllm", "--model", "org/not-a-model")
    assert sim.proc.returncode == 1 and "Invalid repository ID or local directory specified" in sim.text()


# --------------------------------------------------------------------------------- memory edge
@pytest.mark.parametrize(
    ("util", "message"),
    [
        ("0.3", "To serve at least one request with the model's max seq len (131072)"),
        ("0.15", "No available memory for the cache blocks"),
        ("1.0", "on startup is less than desired GPU memory utilization"),
    ],
)
def test_startup_memory_failures(sims: Any, util: str, message: str) -> None:
    sim = sims.exited("vllm", "--model", MODEL, "--gpu-memory-utilization", util)
    text = sim.text()
    assert sim.proc.returncode == 1
    assert message in text and "EngineCore failed to start." in text
    assert "RuntimeError: Engine core initialization failed." in text


def test_a_fraction_that_starts_dies_of_oom_under_a_large_prefill_batch(sims: Any) -> None:
    sim = sims.ready("vllm", "--model", MODEL, "--gpu-memory-utilization", "0.97")
    small = post(sim, "/v1/completions", {"prompt": "hi", "max_tokens": 2, "ignore_eos": True})
    assert small.status_code == 200
    body = {"prompt": list(range(300, 8300)), "max_tokens": 4, "stream": True}
    events = sse(post(sim, "/v1/completions", body).text)
    assert "error" in events[0] and events[-1] == "[DONE]"
    assert sim.wait_exit() == 0  # vLLM's trap: a dead engine exits with code 0
    text = sim.text()
    assert "EngineCore encountered a fatal error." in text and "torch.OutOfMemoryError: CUDA out of memory" in text


def test_a_dead_engine_answers_503_on_health_and_500_on_requests(sims: Any) -> None:
    keep = {"VLLM_KEEP_ALIVE_ON_ENGINE_DEATH": "1"}
    sim = sims.ready("vllm", "--model", MODEL, "--gpu-memory-utilization", "0.97", env=keep)
    post(sim, "/v1/completions", {"prompt": list(range(300, 8300)), "max_tokens": 4})
    assert httpx.get(sim.url + "/health", trust_env=False).status_code == 503
    after = post(sim, "/v1/completions", {"prompt": "hi", "max_tokens": 2})
    assert after.status_code == 500 and "EngineCore encountered an issue" in after.json()["error"]["message"]


# ------------------------------------------------------------------------------------ faults
def test_crash_after_requests(sims: Any) -> None:
    sim = sims.ready("vllm", "--model", MODEL, env={"AUTOTUNE_SIM_FAULT": "crash_after_requests=1"})
    resp = post(sim, "/v1/completions", {"prompt": "x", "max_tokens": 50, "ignore_eos": True})
    assert resp.status_code == 500
    assert sim.wait_exit() == 0 and "EngineCore encountered a fatal error." in sim.text()


def test_hang_at_startup_never_listens(sims: Any) -> None:
    sim = sims.start("vllm", "--model", MODEL, env={"AUTOTUNE_SIM_FAULT": "hang_startup"})
    sim.wait_line("Initializing a V1 LLM engine")
    with pytest.raises(httpx.ConnectError):
        httpx.get(sim.url + "/health", trust_env=False)
    assert sim.proc.poll() is None


def test_dropped_connections_cut_streams(sims: Any) -> None:
    sim = sims.ready("vllm", "--model", MODEL, env={"AUTOTUNE_SIM_FAULT": "drop_connections=1.0"})
    body = {"prompt": "x", "max_tokens": 40, "ignore_eos": True, "stream": True}
    with pytest.raises(httpx.HTTPError):
        post(sim, "/v1/completions", body).raise_for_status()


def test_port_in_use_fails_before_the_engine(sims: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sim = sims.exited("vllm", "--model", MODEL, "--port", str(port))
    assert sim.proc.returncode == 1 and "[Errno 98]" in sim.text()


def test_sigterm_shuts_down_cleanly(sims: Any) -> None:
    sim = sims.ready("vllm", "--model", MODEL)
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == 0
    sim.wait_line("Finished server process")


def test_vllm_034_sizes_the_cache_after_capture_at_full_memory(sims: Any) -> None:
    sim = sims.ready("vllm", "--model", MODEL, env={"AUTOTUNE_SIM_VLLM_VERSION": "0.34.0"})
    extended = sim.wait_line("Extended KV cache to ")
    assert sim.text().index("Graph capturing finished") < sim.text().index(extended)
    body = {"prompt": list(range(300, 8300)), "max_tokens": 4, "ignore_eos": True}
    assert post(sim, "/v1/completions", body).json()["usage"]["completion_tokens"] == 4


def test_crash_after_seconds_of_serving(sims: Any) -> None:
    sim = sims.start("vllm", "--model", MODEL, env={"AUTOTUNE_SIM_FAULT": "crash_after_s=2"})
    assert sim.wait_exit() == 0
    sim.wait_line("Finished server process")
    text = sim.text()
    assert text.index("Application startup complete.") < text.index("EngineCore encountered a fatal error.")
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in text
