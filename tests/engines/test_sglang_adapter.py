"""SglangAdapter: knob spelling per installed version, version drift, launch, log events, facts.

Flag sets come from saved ``--help`` excerpts of SGLang 0.5.9 (old spellings) and 0.5.23 (new
spellings) under ``data/``, printed by a stand-in launch command, so discovery runs for real.
Log lines are the ones SGLang prints (formats from its source), with concrete numbers.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from autotune.config import EngineSettings, SearchSpace, load_yaml
from autotune.engines.base import STARTUP_FATAL, EventKind, LogEvent
from autotune.engines.sglang import SglangAdapter, resolved_knobs
from autotune.engines.vllm import VllmAdapter
from autotune.errors import EngineError, InvalidFlags
from autotune.outcomes import Outcome
from autotune.search.stages import predict_memory_edge

DATA = Path(__file__).parent / "data"
SPACES = Path(__file__).parents[2] / "search_spaces"
OLD, NEW = "0.5.9", "0.5.23"
# Prints a saved --help text, standing in for `python -m sglang.launch_server --help`.
PRINT_FILE = "import sys; sys.stdout.write(open(sys.argv[1]).read())"


def make_adapter(version: str, **settings: object) -> SglangAdapter:
    help_file = DATA / f"sglang-{version}-help.txt"
    command = [sys.executable, "-c", PRINT_FILE, str(help_file)]
    return SglangAdapter(EngineSettings(kind="sglang", model="Qwen/Qwen2.5-7B-Instruct", command=command, **settings))


@pytest.fixture(params=[OLD, NEW])
def any_version(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def events_of(log_name: str) -> list[LogEvent]:
    adapter = make_adapter(NEW)
    lines = (DATA / log_name).read_text().splitlines()
    return [e for e in map(adapter.parse_log_line, lines) if e is not None]


# ---------------------------------------------------------------------------- knob spelling
@pytest.mark.sim
@pytest.mark.parametrize(("version", "flag"), [(OLD, "--cuda-graph-max-bs"), (NEW, "--cuda-graph-max-bs-decode")])
def test_cuda_graph_knob_takes_the_installed_versions_spelling(version: str, flag: str) -> None:
    flags = make_adapter(version).to_flags({"cuda_graph_max_bs": 512})
    assert flags == {flag: 512}


@pytest.mark.sim
def test_portable_knobs_map_to_sglang_flags(any_version: str) -> None:
    flags = make_adapter(any_version).to_flags(
        {"memory_fraction": 0.88, "max_running": 128, "batched_tokens": 4096, "context_len": 8192}
    )
    assert flags == {
        "--mem-fraction-static": 0.88,
        "--max-running-requests": 128,
        "--chunked-prefill-size": 4096,
        "--context-length": 8192,
    }


@pytest.mark.sim
def test_raw_flag_names_are_canonicalised_and_values_kept(any_version: str) -> None:
    flags = make_adapter(any_version).to_flags({"schedule_conservativeness": 0.3, "--schedule-policy": "lpm"})
    assert flags == {"--schedule-conservativeness": 0.3, "--schedule-policy": "lpm"}


@pytest.mark.sim
def test_space_check_with_unsampled_values_keeps_none(any_version: str) -> None:
    # The study checks every flag of a space before sampling, with None as the value.
    flags = make_adapter(any_version).to_flags({"cuda_graph_max_bs": None, "memory_fraction": None})
    assert set(flags.values()) == {None}


@pytest.mark.sim
def test_unique_prefix_is_expanded_like_sglangs_argparse(any_version: str) -> None:
    flags = make_adapter(any_version).to_flags({"--tp": 4, "--speculative-algo": "EAGLE"})
    assert flags == {"--tp-size": 4, "--speculative-algorithm": "EAGLE"}


@pytest.mark.sim
def test_ambiguous_prefix_is_refused_with_candidates() -> None:
    with pytest.raises(InvalidFlags, match=r"--cuda-graph-backend is ambiguous.*decode.*prefill"):
        make_adapter(NEW).to_flags({"--cuda-graph-backend": "disabled"})


@pytest.mark.sim
def test_knob_and_raw_flag_for_the_same_flag_are_refused() -> None:
    with pytest.raises(InvalidFlags, match="both set --mem-fraction-static"):
        make_adapter(NEW).to_flags({"memory_fraction": 0.8, "mem_fraction_static": 0.9})


@pytest.mark.sim
def test_vllm_only_knob_name_is_refused(any_version: str) -> None:
    with pytest.raises(InvalidFlags, match="portable knobs"):
        make_adapter(any_version).to_flags({"tp": 2})


@pytest.mark.sim
@pytest.mark.parametrize(
    ("knob", "value", "expected"),
    [
        ("tensor_parallel", 4, {"--tp-size": 4}),
        ("pipeline_parallel", 2, {"--pp-size": 2}),
        ("block_size", 16, {"--page-size": 16}),
        ("kv_cache_dtype", "fp8_e4m3", {"--kv-cache-dtype": "fp8_e4m3"}),
        ("scheduling_policy", "fcfs", {"--schedule-policy": "fcfs"}),
        # SGLang caches prefixes unless told not to: the knob's sense is inverted.
        ("prefix_caching", False, {"--disable-radix-cache": True}),
        ("prefix_caching", True, {"--disable-radix-cache": False}),
    ],
)
def test_more_portable_knobs(knob: str, value: object, expected: dict[str, object], any_version: str) -> None:
    assert make_adapter(any_version).to_flags({knob: value}) == expected


@pytest.mark.sim
@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (OLD, {"--disable-cuda-graph": True}),
        (NEW, {"--disable-decode-cuda-graph": True, "--disable-prefill-cuda-graph": True}),
    ],
)
def test_enforce_eager_avoids_the_deprecated_flag_where_it_can(version: str, expected: dict[str, bool]) -> None:
    adapter = make_adapter(version)
    flags = adapter.to_flags({"enforce_eager": True})
    assert flags == expected
    argv = adapter.build_launch(flags, 31000).argv
    assert all(flag in argv for flag in expected)


@pytest.mark.sim
def test_prefix_caching_on_renders_nothing() -> None:
    adapter = make_adapter(NEW)
    argv = adapter.build_launch(adapter.to_flags({"prefix_caching": True}), 31000).argv
    assert not any("radix" in token for token in argv)


def test_every_vllm_knob_but_chunked_prefill_has_an_sglang_flag() -> None:
    # chunked prefill is always on in SGLang; its size is the batched_tokens knob. SGLang sizes a
    # pinned KV pool in tokens (--max-total-tokens), not in bytes.
    assert set(VllmAdapter.knobs) - set(SglangAdapter.knobs) == {"chunked_prefill", "kv_cache_memory_bytes"}


# ---------------------------------------------------------------------------- version drift
RENAMED_MSG = (
    "`--cuda-graph-max-bs` was renamed to `--cuda-graph-max-bs-decode` in SGLang 0.5.15, and the old "
    "spelling removed in 0.5.20; use the portable knob cuda_graph_max_bs"
)


@pytest.mark.sim
def test_removed_flag_against_new_sglang_names_its_replacement_in_to_flags() -> None:
    with pytest.raises(InvalidFlags) as err:
        make_adapter(NEW).to_flags({"memory_fraction": 0.9, "--cuda-graph-max-bs": 512})
    assert str(err.value) == RENAMED_MSG


@pytest.mark.sim
def test_removed_flag_against_new_sglang_names_its_replacement_in_validate() -> None:
    with pytest.raises(InvalidFlags) as err:
        make_adapter(NEW).validate_flags(["--mem-fraction-static", "--cuda-graph-max-bs"])
    assert str(err.value) == RENAMED_MSG


@pytest.mark.sim
def test_new_spelling_against_old_sglang_points_to_the_knob() -> None:
    with pytest.raises(InvalidFlags, match=r"only exists from SGLang 0.5.15.*`--cuda-graph-max-bs`.*cuda_graph_max_bs"):
        make_adapter(OLD).to_flags({"--cuda-graph-max-bs-decode": 256})


@pytest.mark.sim
def test_removed_batch_size_list_flag_names_the_decode_list() -> None:
    with pytest.raises(InvalidFlags, match=r"`--cuda-graph-bs` was renamed to `--cuda-graph-bs-decode`"):
        make_adapter(NEW).to_flags({"cuda_graph_bs": [1, 2, 4]})


@pytest.mark.sim
def test_old_spelling_is_fine_on_old_sglang() -> None:
    adapter = make_adapter(OLD)
    flags = adapter.to_flags({"--cuda-graph-max-bs": 512, "--cuda-graph-bs": [1, 2, 4]})
    adapter.validate_flags(flags)
    assert flags == {"--cuda-graph-max-bs": 512, "--cuda-graph-bs": [1, 2, 4]}


@pytest.mark.sim
@pytest.mark.parametrize(
    ("flag", "advice", "since"),
    [
        ("--disable-cuda-graph", "--cuda-graph-backend-decode disabled", "0.5.15"),
        ("--enable-dp-attention", "--attn-dp-size", "0.5.22"),
    ],
)
def test_deprecated_flag_warns_once_and_is_accepted(
    flag: str, advice: str, since: str, caplog: pytest.LogCaptureFixture
) -> None:
    adapter = make_adapter(NEW)
    with caplog.at_level(logging.WARNING, logger="autotune.engines.sglang"):
        adapter.validate_flags([flag])
        adapter.validate_flags([flag])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert flag in warnings[0] and f"since SGLang {since}" in warnings[0] and advice in warnings[0]


@pytest.mark.sim
def test_deprecated_flags_are_current_on_old_sglang(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="autotune.engines.sglang"):
        make_adapter(OLD).validate_flags(["--disable-cuda-graph", "--enable-dp-attention"])
    assert not caplog.records


@pytest.mark.sim
def test_unknown_flag_names_the_closest_spelling(any_version: str) -> None:
    with pytest.raises(
        InvalidFlags, match=r"sglang does not accept --max-running-request: did you mean --max-running-requests\?"
    ):
        make_adapter(any_version).validate_flags(["--max-running-request"])


@pytest.mark.sim
def test_help_is_run_once_per_adapter(tmp_path: Path) -> None:
    counter = tmp_path / "calls"
    code = f"open({str(counter)!r}, 'a').write('x'); " + PRINT_FILE
    command = [sys.executable, "-c", code, str(DATA / "sglang-0.5.23-help.txt")]
    adapter = SglangAdapter(EngineSettings(kind="sglang", model="m", command=command))
    adapter.to_flags({"cuda_graph_max_bs": 256})
    adapter.validate_flags(["--cuda-graph-max-bs-decode"])
    adapter.build_launch({}, 31000)
    assert counter.read_text() == "x"


@pytest.mark.sim
def test_missing_engine_command_is_one_actionable_line() -> None:
    settings = EngineSettings(kind="sglang", model="m", command=["/nonexistent/python3"])
    with pytest.raises(
        InvalidFlags, match=r"engine command not found.*point --command \(engine\.command in a config file\)"
    ):
        SglangAdapter(settings).to_flags({"memory_fraction": 0.9})


@pytest.mark.sim
@pytest.mark.parametrize("space", ["sglang-throughput.yaml", "sglang-latency.yaml"])
def test_shipped_spaces_are_valid_flags_on_old_and_new_sglang(space: str, any_version: str) -> None:
    loaded = load_yaml(SPACES / space, SearchSpace)
    assert loaded.engine == "sglang"
    adapter = make_adapter(any_version)
    flags = adapter.to_flags({**loaded.fixed, **dict.fromkeys(loaded.params)})
    adapter.validate_flags(flags)
    assert len(flags) == len(loaded.params) + len(loaded.fixed)


# ----------------------------------------------------------------------------------- launch
@pytest.mark.sim
def test_launch_has_model_address_metrics_and_flags(any_version: str) -> None:
    adapter = make_adapter(any_version, env={"SGLANG_LOG_MS": "1"})
    flags = adapter.to_flags({"memory_fraction": 0.85, "cuda_graph_max_bs": 512, "--disable-radix-cache": True})
    spec = adapter.build_launch(flags, 31234)
    argv = spec.argv
    assert argv[: len(adapter.launch_prefix())] == adapter.launch_prefix()
    assert argv[argv.index("--model-path") + 1] == "Qwen/Qwen2.5-7B-Instruct"
    assert argv[argv.index("--port") + 1] == "31234" and argv[argv.index("--host") + 1] == "127.0.0.1"
    assert argv.count("--enable-metrics") == 1
    assert argv[argv.index("--mem-fraction-static") + 1] == "0.85"
    graph_flag = "--cuda-graph-max-bs-decode" if any_version == NEW else "--cuda-graph-max-bs"
    assert argv[argv.index(graph_flag) + 1] == "512"
    assert "--disable-radix-cache" in argv
    assert spec.env == {"PYTHONUNBUFFERED": "1", "SGLANG_LOG_MS": "1"}
    assert spec.base_url == "http://127.0.0.1:31234"


@pytest.mark.sim
@pytest.mark.parametrize("version", [NEW, OLD])
def test_readiness_is_never_v1_models(version: str) -> None:
    # Whether the release serves /ready is decided on its first answer (404: /health instead).
    spec = make_adapter(version).build_launch({}, 31000)
    assert (spec.ready_path, spec.ready_fallback) == ("/ready", "/health")
    assert SglangAdapter.health_path == "/health"


@pytest.mark.sim
def test_false_store_true_flag_is_left_out_not_negated() -> None:
    adapter = make_adapter(NEW)
    argv = adapter.build_launch({"--disable-radix-cache": False, "--enable-metrics": True}, 31000).argv
    assert "--disable-radix-cache" not in argv and "--no-disable-radix-cache" not in argv
    assert argv.count("--enable-metrics") == 1


@pytest.mark.sim
@pytest.mark.parametrize("flag", ["--port", "--host", "--model-path", "--model"])
def test_tuner_owned_flags_are_refused(flag: str) -> None:
    with pytest.raises(InvalidFlags, match=f"{flag} cannot be tuned or fixed"):
        make_adapter(NEW).build_launch({flag: "x"}, 31000)


@pytest.mark.sim
def test_fixed_flags_reach_every_launch_and_trial_flags_win() -> None:
    adapter = make_adapter(NEW, fixed_flags={"tp_size": 4, "memory_fraction": 0.8})
    argv = adapter.build_launch({"--mem-fraction-static": 0.9}, 31000).argv
    assert argv[argv.index("--tp-size") + 1] == "4"
    assert argv.count("--mem-fraction-static") == 1 and argv[argv.index("--mem-fraction-static") + 1] == "0.9"


# ------------------------------------------------------------------------------- log events
def test_new_startup_log_events_in_order() -> None:
    events = events_of("sglang-0.5.23-startup.log")
    kinds = [e.kind for e in events]
    assert kinds[:11] == [
        EventKind.NON_DEFAULT_ARGS,
        EventKind.KV_CAPACITY,  # "Memory baseline taken. mem usage=0.52 GB"
        EventKind.KV_CAPACITY,  # "Load weight begin. avail mem=78.62 GB"
        EventKind.STARTUP_PHASE,  # "Load weight end. elapsed=14.80 s"
        EventKind.KV_CAPACITY,
        EventKind.GRAPH_CAPTURE,
        EventKind.GRAPH_CAPTURE,
        EventKind.GRAPH_CAPTURE,
        EventKind.GRAPH_CAPTURE,
        EventKind.KV_CAPACITY,
        EventKind.READY,
    ]
    assert events[3].data == {"phase": "weights", "seconds": 14.8}
    assert kinds.count(EventKind.DECODE_BATCH) == 4 and kinds.count(EventKind.PREEMPTION) == 2


def test_kv_capacity_line_gives_capacity_concurrency_and_real_headroom() -> None:
    line = (
        "[2026-06-20 10:00:40 TP0] max_total_num_tokens=665690, chunked_prefill_size=8192, "
        "max_prefill_tokens=16384, max_running_requests=4096, context_len=65536, available_gpu_mem=13.50 GB"
    )
    event = make_adapter(NEW).parse_log_line(line)
    assert event is not None and event.kind == EventKind.KV_CAPACITY
    assert event.data == {
        "kv_tokens": 665690,
        "source": "scheduler",
        "max_concurrency": 4096,
        "context_len": 65536,
        "chunked_prefill_size": 8192,
        "max_prefill_tokens": 16384,
        "headroom_gib": 13.5,
    }


def test_kv_capacity_on_cpu_reads_available_cpu_mem() -> None:
    line = (
        "max_total_num_tokens=4096, max_prefill_tokens=16384, max_running_requests=8, "
        "context_len=2048, available_cpu_mem=20.00 GB"
    )
    event = make_adapter(NEW).parse_log_line(line)
    assert event is not None and event.data["headroom_gib"] == 20.0 and event.data["kv_tokens"] == 4096


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 1003432, K size: 26.79 GB, V size: 26.79 GB",
            {"kv_tokens": 1003432, "kv_gib": 53.58, "kv_dtype": "torch.bfloat16", "source": "kv_pool"},
        ),
        (
            "KV Cache is allocated. dtype: torch.bfloat16, #tokens: 2000000, KV size: 8.58 GB",
            {"kv_tokens": 2000000, "kv_gib": 8.58, "kv_dtype": "torch.bfloat16", "source": "kv_pool"},
        ),
        (
            "KV Cache is VA upper bound. dtype: fp8_e4m3, #tokens: 500000, K size: 5.00 GB, V size: 5.00 GB",
            {"kv_tokens": 500000, "kv_gib": 10.0, "kv_dtype": "fp8_e4m3", "source": "kv_pool"},
        ),
    ],
)
def test_kv_pool_lines(line: str, expected: dict[str, object]) -> None:
    event = make_adapter(NEW).parse_log_line(line)
    assert event is not None and event.kind == EventKind.KV_CAPACITY and event.data == expected


def test_kv_pool_smaller_than_context_is_noted_not_fatal() -> None:
    event = make_adapter(NEW).parse_log_line(
        "KV pool holds 3000 tokens, fewer than --context-length 32768. Requests ..."
    )
    assert event is not None and event.kind == EventKind.KV_CAPACITY
    assert event.data["kv_below_context"] is True and event.kind not in STARTUP_FATAL


def test_graph_capture_begin_and_end() -> None:
    adapter = make_adapter(NEW)
    begin = adapter.parse_log_line(
        "Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=9.99 GB"
    )
    end = adapter.parse_log_line(
        "Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 512], elapsed=8.70 s, "
        "mem usage=1.02 GB, avail mem=8.97 GB."
    )
    assert begin is not None and begin.kind == EventKind.GRAPH_CAPTURE
    assert begin.data == {"phase": "begin", "stage": "decode", "model": "target", "avail_gib": 9.99}
    assert end is not None and end.data["phase"] == "end" and end.data["max_bs"] == 512
    assert end.data["seconds"] == 8.7 and end.data["gib"] == 1.02 and end.data["batch_sizes"][-1] == 512


def test_old_graph_capture_wording() -> None:
    adapter = make_adapter(OLD)
    begin = adapter.parse_log_line("Capture cuda graph begin. This can take up to several minutes. avail mem=10.30 GB")
    end = adapter.parse_log_line("Capture cuda graph end. Time elapsed: 14.02 s. mem usage=1.20 GB. avail mem=9.10 GB.")
    assert begin is not None and begin.data["phase"] == "begin"
    expected = {"phase": "end", "stage": "decode", "seconds": 14.02, "gib": 1.2, "avail_gib": 9.1}
    assert end is not None and end.data == expected


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            "Decode batch, #running-req: 233, #token: 370959, token usage: 0.82, cuda graph: True, "
            "gen throughput (token/s): 4594.01, #queue-req: 317",
            {
                "running": 233,
                "tokens": 370959,
                "token_usage": 0.82,
                "cuda_graph": True,
                "gen_throughput": 4594.01,
                "queue": 317,
            },
        ),
        (
            "[2026-06-20 10:01:11 TP3] Decode batch, #running-req: 48, #token: 9000, token usage: 0.31, "
            "accept len: 2.71, accept rate: 0.68, cuda graph: False, gen throughput (token/s): 812.40, #queue-req: 0",
            {
                "running": 48,
                "tokens": 9000,
                "token_usage": 0.31,
                "cuda_graph": False,
                "gen_throughput": 812.4,
                "queue": 0,
                "accept_len": 2.71,
            },
        ),
        (
            "Decode batch, #running-req: 5, #full token: 100, full token usage: 0.12, #swa token: 50, "
            "swa token usage: 0.40, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 2",
            # The tightest pool counts: the SWA pool is fuller than the full-attention one.
            {"running": 5, "tokens": 100, "token_usage": 0.4, "cuda_graph": True, "gen_throughput": 10.0, "queue": 2},
        ),
    ],
)
def test_decode_batch_lines(line: str, expected: dict[str, object]) -> None:
    event = make_adapter(NEW).parse_log_line(line)
    assert event is not None and event.kind == EventKind.DECODE_BATCH and event.data == expected


def test_retraction_warning_is_a_preemption() -> None:
    line = (
        "[2026-06-20 10:01:12] KV cache pool is full. Retract requests. #retracted_reqs: 3, "
        "#new_tokens_gained: 4096, #new_token_ratio: 0.7000 -> 0.8500"
    )
    event = make_adapter(NEW).parse_log_line(line)
    assert event is not None and event.kind == EventKind.PREEMPTION
    assert event.data == {
        "retracted": 3,
        "tokens_gained": 4096,
        "new_token_ratio_before": 0.7,
        "new_token_ratio_after": 0.85,
    }


def test_ready_is_the_fired_up_line_not_uvicorn_or_prefill() -> None:
    adapter = make_adapter(NEW)
    assert adapter.parse_log_line("INFO:     Uvicorn running on http://127.0.0.1:30000 (Press CTRL+C to quit)") is None
    ready = adapter.parse_log_line("[2026-06-20 10:00:44] The server is fired up and ready to roll!")
    assert ready is not None and ready.kind == EventKind.READY


def test_resolved_server_args_are_parsed_both_forms() -> None:
    new = events_of("sglang-0.5.23-startup.log")[0]
    assert new.kind == EventKind.NON_DEFAULT_ARGS and new.data["resolved"] is True
    assert new.data["args"]["mem_fraction_static"] == 0.83
    old_line = (DATA / "sglang-0.5.9-startup.log").read_text().splitlines()[0]
    old = make_adapter(OLD).parse_log_line(old_line)
    assert old is not None and old.data["args"]["cuda_graph_max_bs"] == 256


@pytest.mark.parametrize(
    "line",
    [
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7) 2. set --cuda-graph-max-bs-decode "
        "to a smaller value (e.g., 16) 3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled",
        "Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, #running-req: 0, "
        "#queue-req: 0, #pending-token: 0, cuda graph: True, input throughput (token/s): 0.00",
        "max_total_tokens=900000 is larger than the profiled value 800000. Use the profiled value instead.",
    ],
)
def test_lines_that_say_nothing_we_use(line: str) -> None:
    assert make_adapter(NEW).parse_log_line(line) is None


# --------------------------------------------------------------------- failure classification
TOO_LOW_WEIGHTS = (
    "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.5. "
    "Raise --mem-fraction-static above 0.62 (minimum viable = 1 - available/pre = 0.61). "
    "If using speculative decoding, draft weights are now counted."
)
TOO_LOW_TOKENS = (
    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
    "Current value: mem_fraction_static=0.6"
)
TOO_HIGH_CAPTURE = (
    "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.11 GiB of which 1.02 GiB is free."
)
SIGQUIT = "Received sigquit from a child process. It usually means the child failed."


@pytest.mark.parametrize(
    ("line", "kind", "direction", "outcome"),
    [
        (TOO_LOW_WEIGHTS, EventKind.KV_INSUFFICIENT, "too_low", Outcome.KV_INSUFFICIENT),
        (TOO_LOW_TOKENS, EventKind.KV_INSUFFICIENT, "too_low", Outcome.KV_INSUFFICIENT),
        (
            "RuntimeError: Hybrid (mamba/linear-attention) state cache is too small to serve any requests.",
            EventKind.KV_INSUFFICIENT,
            "too_low",
            Outcome.KV_INSUFFICIENT,
        ),
        (TOO_HIGH_CAPTURE, EventKind.OOM_STARTUP, "too_high", Outcome.OOM_STARTUP),
    ],
)
def test_memory_failures_are_classified_by_direction(
    line: str, kind: EventKind, direction: str, outcome: Outcome
) -> None:
    adapter = make_adapter(NEW)
    lines = ["Scheduler hit an exception: Traceback (most recent call last):", line, SIGQUIT]
    events = [e for e in map(adapter.parse_log_line, lines) if e is not None]
    assert events[0].kind == kind and kind in STARTUP_FATAL
    assert events[0].data["memory_direction"] == direction
    # SGLang SIGKILLs its own tree after a scheduler failure: -9 is the engine's failure.
    assert adapter.classify_failure(-9, events) == outcome


def test_too_low_failures_carry_the_fraction_and_its_minimum() -> None:
    adapter = make_adapter(NEW)
    weights = adapter.parse_log_line(TOO_LOW_WEIGHTS)
    tokens = adapter.parse_log_line(TOO_LOW_TOKENS)
    assert weights is not None and weights.data["mem_fraction_static"] == 0.5 and weights.data["min_fraction"] == 0.62
    assert tokens is not None and tokens.data["mem_fraction_static"] == 0.6


def test_bare_cuda_oom_before_ready_is_a_startup_oom() -> None:
    adapter = make_adapter(NEW)
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has 79.11 GiB total"
    event = adapter.parse_log_line(line)
    # The line alone cannot say when it happened; after readiness it is a runtime OOM.
    assert event is not None and event.kind == EventKind.OOM_RUNTIME
    assert event.data["memory_direction"] == "too_high"
    assert adapter.classify_failure(-9, [event]) == Outcome.OOM_STARTUP


def test_first_memory_failure_decides() -> None:
    adapter = make_adapter(NEW)
    events = [e for e in map(adapter.parse_log_line, [TOO_LOW_TOKENS, TOO_HIGH_CAPTURE]) if e]
    assert adapter.classify_failure(-9, events) == Outcome.KV_INSUFFICIENT


def test_aborted_request_is_a_runtime_kv_oom() -> None:
    event = make_adapter(NEW).parse_log_line("retract_decode: aborted last request 8f2e1c due to OOM")
    assert event is not None and event.kind == EventKind.OOM_RUNTIME
    assert event.data["memory_direction"] == "too_low" and event.data["request"] == "8f2e1c"


def test_ambiguous_removed_flag_from_argparse_is_invalid_args_naming_the_rename() -> None:
    adapter = make_adapter(NEW)
    line = (
        "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
        "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"
    )
    event = adapter.parse_log_line(line)
    assert event is not None and event.kind == EventKind.INVALID_ARGS
    assert event.data["flag"] == "--cuda-graph-max-bs"
    assert event.data["candidates"] == ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]
    assert event.data["renamed_to"] == "--cuda-graph-max-bs-decode"
    assert adapter.classify_failure(2, [event]) == Outcome.INVALID_FLAGS


def test_unrecognized_argument_is_invalid_args() -> None:
    event = make_adapter(NEW).parse_log_line("launch_server.py: error: unrecognized arguments: --max-num-seqs 8")
    assert event is not None and event.kind == EventKind.INVALID_ARGS


def test_scheduler_death_at_init_is_fatal_with_its_exit_code() -> None:
    line = (
        "RuntimeError: Rank 0 scheduler died during initialization (exit code: -9). If exit code is -9 "
        "(SIGKILL), a common cause is the OS OOM killer."
    )
    event = make_adapter(NEW).parse_log_line(line)
    assert event is not None and event.kind == EventKind.WORKER_DIED
    assert event.kind in STARTUP_FATAL
    assert event.data == {"worker": "scheduler", "exit_code": -9}


@pytest.mark.parametrize(
    "line", [SIGQUIT, "SIGQUIT received. signum=None, frame=None. It usually means one child failed."]
)
def test_parent_tree_kill_lines_leave_the_childs_error_as_the_reason(line: str) -> None:
    assert make_adapter(NEW).parse_log_line(line) is None


def test_minus_nine_without_a_cause_is_a_crash_not_an_interrupt() -> None:
    adapter = make_adapter(NEW)
    assert adapter.classify_failure(-9, []) == Outcome.CRASH
    args = adapter.parse_log_line("[2026-06-20 10:00:01] server_args={'model_path': 'm'}")
    assert args is not None and adapter.classify_failure(-9, [args]) == Outcome.CRASH


def test_timeout_vs_hung_scheduler() -> None:
    adapter = make_adapter(NEW)
    assert adapter.classify_failure(None, []) == Outcome.STARTUP_TIMEOUT
    watchdog = adapter.parse_log_line("Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)")
    assert watchdog is not None and watchdog.kind == EventKind.FATAL
    assert adapter.classify_failure(None, [watchdog]) == Outcome.CRASH


def test_port_in_use() -> None:
    line = "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use"
    event = make_adapter(NEW).parse_log_line(line)
    assert event is not None and event.kind == EventKind.PORT_IN_USE
    assert make_adapter(NEW).classify_failure(1, [event]) == Outcome.CRASH


# ----------------------------------------------------------------------------- engine facts
LABELS = 'engine_type="unified",model_name="qwen",tp_rank="{}"'


def metric(name: str, rank: int = 0) -> str:
    return f"{name}{{{LABELS.format(rank)}}}"


def test_engine_facts_from_log_and_metric_deltas() -> None:
    events = events_of("sglang-0.5.23-startup.log")
    before = {
        metric("sglang:num_retracted_requests_total", 0): 2.0,
        metric("sglang:num_retracted_requests_total", 1): 1.0,
        "sglang:prompt_tokens_total": 1000.0,
        "sglang:cached_tokens_total": 0.0,
    }
    after = {
        metric("sglang:num_retracted_requests_total", 0): 6.0,
        metric("sglang:num_retracted_requests_total", 1): 4.0,
        "sglang:prompt_tokens_total": 11000.0,
        "sglang:cached_tokens_total": 2500.0,
        metric("sglang:cache_hit_rate"): 0.9,
    }
    facts = make_adapter(NEW).engine_facts(events, before, after)
    assert facts["kv_tokens"] == 1003432
    assert facts["max_concurrency"] == 4096
    assert facts["context_len"] == 32768
    assert facts["headroom_gib"] == 8.97
    assert facts["kv_gib"] == 53.58
    assert facts["cuda_graph_max_bs"] == 256
    assert facts["graph_capture_s"] == pytest.approx(19.9)
    assert facts["retractions"] == facts["preemptions"] == 7  # counter delta summed over ranks
    assert facts["retraction_warnings"] == 2
    assert facts["token_usage_peak"] == 0.96
    assert facts["token_usage_mean"] == pytest.approx((0.82 + 0.90 + 0.96 + 0.40) / 4, abs=1e-4)
    assert facts["cuda_graph_false_share"] == 0.5
    assert facts["queue_peak"] == 317
    assert facts["running_peak"] == 300
    assert facts["decode_logs"] == 4
    assert facts["cache_hit_rate"] == 0.25  # over the run, not the lifetime gauge
    assert facts["resolved_knobs"]["memory_fraction"] == 0.83
    assert facts["resolved_knobs"]["cuda_graph_max_bs"] == 256


def test_engine_facts_without_metrics_count_retractions_from_the_log() -> None:
    facts = make_adapter(NEW).engine_facts(events_of("sglang-0.5.23-startup.log"), {}, {})
    assert facts["retractions"] == facts["preemptions"] == 5  # 3 + 2 retracted requests
    assert "cache_hit_rate" not in facts


def test_engine_facts_fall_back_to_the_cache_gauge() -> None:
    facts = make_adapter(NEW).engine_facts([], {}, {metric("sglang:cache_hit_rate"): 0.4})
    assert facts["cache_hit_rate"] == 0.4
    assert facts["preemptions"] == 0 and facts["decode_logs"] == 0
    assert "token_usage_peak" not in facts and "cuda_graph_false_share" not in facts


def test_engine_facts_from_old_log() -> None:
    adapter = make_adapter(OLD)
    lines = (DATA / "sglang-0.5.9-startup.log").read_text().splitlines()
    events = [e for e in map(adapter.parse_log_line, lines) if e is not None]
    facts = adapter.engine_facts(events, {}, {})
    assert facts["kv_tokens"] == 430000 and facts["headroom_gib"] == 9.1 and facts["graph_capture_s"] == 14.02
    assert facts["resolved_knobs"]["cuda_graph_max_bs"] == 256 and facts["resolved_knobs"]["memory_fraction"] == 0.88
    assert facts["token_usage_peak"] == 0.82 and facts["cuda_graph_false_share"] == 0.0


def test_resolved_knobs_prefer_effective_values() -> None:
    info = {
        "mem_fraction_static": 0.903,
        "max_running_requests": None,
        "chunked_prefill_size": 8192,
        "cuda_graph_max_bs_decode": 512,
        "max_total_num_tokens": 123456,
        "version": "0.5.23",
        "internal_states": [{"effective_max_running_requests_per_dp": 2048}],
    }
    knobs = resolved_knobs(info)
    assert knobs["max_running"] == 2048 and knobs["cuda_graph_max_bs"] == 512
    assert knobs["kv_tokens"] == 123456 and knobs["engine_version"] == "0.5.23" and knobs["context_len"] is None


# ----------------------------------------------------------------------------- server info
class _InfoHandler(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, tuple[int, object]]] = {}

    def do_GET(self) -> None:
        status, body = self.routes.get(self.path, (404, {"detail": "Not Found"}))
        payload = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        pass


@pytest.fixture
def info_server() -> Iterator[tuple[str, type[_InfoHandler]]]:
    handler = type("Handler", (_InfoHandler,), {"routes": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.sim
def test_resolved_args_reads_server_info(info_server: tuple[str, type[_InfoHandler]]) -> None:
    url, handler = info_server
    handler.routes["/server_info"] = (200, {"mem_fraction_static": 0.83, "version": "0.5.23"})
    assert make_adapter(NEW).resolved_args(url)["mem_fraction_static"] == 0.83


@pytest.mark.sim
def test_resolved_args_falls_back_to_the_old_endpoint(info_server: tuple[str, type[_InfoHandler]]) -> None:
    url, handler = info_server
    handler.routes["/get_server_info"] = (200, {"mem_fraction_static": 0.88})
    assert make_adapter(OLD).resolved_args(url + "/") == {"mem_fraction_static": 0.88}


@pytest.mark.sim
def test_resolved_args_errors_are_one_line(info_server: tuple[str, type[_InfoHandler]]) -> None:
    url, handler = info_server
    with pytest.raises(EngineError, match="neither /server_info nor /get_server_info"):
        make_adapter(NEW).resolved_args(url)
    handler.routes["/server_info"] = (503, {})
    with pytest.raises(EngineError, match="answered 503"):
        make_adapter(NEW).resolved_args(url)
    with pytest.raises(EngineError, match=r"failed \(ConnectError\)"):
        make_adapter(NEW).resolved_args("http://127.0.0.1:9", timeout_s=2)


def test_gpu_count_reads_every_spelling_each_engine_accepts(any_version: str) -> None:
    sglang = make_adapter(any_version)
    assert sglang.gpu_count({}) == 1
    assert sglang.gpu_count({"--tp-size": 2, "--dp": 2}) == 4  # argparse prefix --dp for --dp-size
    assert sglang.gpu_count({"--tp": 4, "--pp-size": 2, "--max-running-requests": 64}) == 8
    vllm = VllmAdapter(EngineSettings(kind="vllm", model="m"))
    assert vllm.gpu_count({"-tp": 2, "--pipeline-parallel-size": 2}) == 4
    assert vllm.gpu_count({"--tp-size": 8}) == 1  # an SGLang spelling is not vLLM's


# ----------------------------------------------------------------------- start-up memory budget
def test_memory_budget_facts_from_the_new_startup_log() -> None:
    facts = make_adapter(NEW).engine_facts(events_of("sglang-0.5.23-startup.log"), {}, {})
    # The fraction is a share of the free memory before the weights load; the card is that plus
    # what the process held at its baseline (SGLang logs no card size).
    assert (facts["memory_budget"], facts["mem_free_gib"], facts["mem_total_gib"]) == ("static", 78.62, 79.14)
    assert facts["graph_gib"] == 1.43 and "activation_peak_gib" not in facts  # SGLang profiles none
    # 1 − (graphs 1.43 + 5 % of 79.14) ÷ 78.62 = 0.931 → 0.92 on the grid
    assert predict_memory_edge(facts, 0.80, 0.98) == 0.92


def test_memory_budget_of_an_old_release_without_the_baseline_line() -> None:
    facts = make_adapter(OLD).engine_facts(events_of("sglang-0.5.9-startup.log"), {}, {})
    assert (facts["memory_budget"], facts["mem_free_gib"], facts["mem_total_gib"]) == ("static", 78.5, 78.5)


@pytest.mark.parametrize(
    ("line", "data"),
    [
        (
            "[2026-06-20 10:00:04 TP1] Load weight begin. avail mem=78.62 GB",
            {"memory_budget": "static", "mem_free_gib": 78.62},
        ),
        ("[2026-06-20 10:00:04] Memory baseline taken. mem usage=0.52 GB", {"baseline_usage_gib": 0.52}),
    ],
)
def test_memory_budget_lines(line: str, data: dict[str, object]) -> None:
    event = make_adapter(NEW).parse_log_line(line)
    assert event is not None and event.kind == EventKind.KV_CAPACITY and event.data == data


# ------------------------------------------------------------------ the weight-cache daemon
def test_the_weight_cache_daemon_needs_0_5_23_and_a_command_that_names_sglang(tmp_path: Path) -> None:
    assert "0.5.23" in (make_adapter(NEW).weight_cache_unsupported("0.5.20") or "")
    assert "not known" in (make_adapter(NEW).weight_cache_unsupported(None) or "")
    assert "no weight-cache daemon module" in (make_adapter(NEW).weight_cache_unsupported("0.5.23") or "")
    plain = SglangAdapter(EngineSettings(kind="sglang", model="m", python="/opt/sglang/bin/python"))
    assert plain.weight_cache_unsupported("0.5.23") is None


@pytest.mark.sim
def test_one_standalone_daemon_per_engine_ready_when_every_gpu_marked_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    adapter = SglangAdapter(EngineSettings(kind="sglang", model="m", python="/opt/sglang/bin/python"))
    known = make_adapter(NEW).discover_flags()  # 0.5.23's --help, without an installed SGLang
    monkeypatch.setattr(adapter, "discover_flags", lambda *args, **kwargs: known)
    flags = {"--tp-size": 2, "--max-running-requests": 64, "--mem-fraction-static": 0.85}
    daemon = adapter.weight_daemon(flags, tmp_path, 0)
    assert daemon.argv == [
        "/opt/sglang/bin/python",
        "-m",
        "sglang.srt.weight_cache.daemon",
        "--model-path",
        "m",
        "--tp-size",
        "2",
    ]
    assert daemon.client_flags == {"--weight-cache-mode": "client"} and daemon.ready_url is None
    socket = daemon.client_env["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"]
    assert (
        socket == str(tmp_path / "{device_uuid}.sock") and daemon.env["SGLANG_WEIGHT_CACHE_SOCKET_TEMPLATE"] == socket
    )
    assert daemon.ready_check is not None and not daemon.ready_check()
    (tmp_path / "GPU-0.ready").write_text("pid=1\n")
    assert not daemon.ready_check()  # one of the two ranks
    (tmp_path / "GPU-1.ready").write_text("pid=1\n")
    assert daemon.ready_check()
    # Seqs and the fraction are not in the key: one daemon serves both trials.
    other = adapter.weight_daemon({"--tp-size": 2, "--max-running-requests": 8}, tmp_path, 0)
    assert other.key == daemon.key
    assert adapter.weight_daemon({"--tp-size": 4}, tmp_path, 0).key != daemon.key
    assert "draft model" in (adapter.weight_cache_conflict({"--speculative-algorithm": "EAGLE"}) or "")
    assert adapter.weight_cache_conflict(flags) is None
