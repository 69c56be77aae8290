"""The SGLang adapter against every release's own files (``data/sglang-releases``).

The fixtures are made by ``scripts/sglang-matrix.sh`` from the released wheels: each release's
real ``--help`` (its argparse parser built on CPU), its HTTP routes, the format strings of the log
lines the adapter reads, and its ``sglang:`` metric names. Log lines are rendered from those
format strings with sample values, so a release that moves a number to another line, or adds a
prefix, fails here before it fails a user's study.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.config import EngineSettings
from autotune.engines.base import EventKind, LogEvent
from autotune.engines.sglang import FLAG_CHANGES, SglangAdapter
from autotune.runtime.ports import free_port
from autotune.runtime.process import EngineProcess
from autotune_sim.dialects.sglang_args import RELEASES as SIM_RELEASES

ROOT = Path(__file__).parents[2]
FIXTURES = Path(__file__).parent / "data" / "sglang-releases"
PRINT_FILE = "import sys; sys.stdout.write(open(sys.argv[1]).read())"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _load_matrix_script() -> Any:
    spec = importlib.util.spec_from_file_location("sglang_matrix", ROOT / "scripts" / "sglang_matrix.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MATRIX = _load_matrix_script()
RELEASES = {str(d["release"]): d for d in MATRIX.load(FIXTURES)}
VERSIONS = sorted(RELEASES, key=_version)


@pytest.fixture(params=VERSIONS)
def release(request: pytest.FixtureRequest) -> dict[str, Any]:
    return RELEASES[str(request.param)]


def adapter_for(release: dict[str, Any], tmp_path: Path) -> SglangAdapter:
    """An adapter whose `--help` is the release's own (printed by a stand-in command)."""
    help_file = tmp_path / f"sglang-{release['release']}-help.txt"
    packed = FIXTURES / f"{release['release']}-help.txt.gz"
    if packed.is_file():
        help_file.write_bytes(gzip.decompress(packed.read_bytes()))
    else:  # a fixture read statically: its flags as argparse would declare them
        help_file.write_text("options:\n" + "".join(f"  {flag} X\n" for flag in release["flags"]))
    command = [sys.executable, "-c", PRINT_FILE, str(help_file)]
    return SglangAdapter(EngineSettings(kind="sglang", model="Qwen/Qwen2.5-7B-Instruct", command=command))


def test_the_matrix_spans_the_releases() -> None:
    assert len(VERSIONS) >= 6 and VERSIONS[0] == "0.5.9"
    for data in RELEASES.values():
        assert data["schema_version"] == 1 and len(data["flags"]) > 300, data["release"]


# ------------------------------------------------------------------------------------ flags
def test_flag_changes_name_the_releases_that_made_them(release: dict[str, Any]) -> None:
    version, flags = _version(release["release"]), set(release["flags"])
    for change in FLAG_CHANGES:
        assert (change.new in flags) is (version >= _version(change.since)), (change.new, release["release"])
        removed = change.removed_in is not None and version >= _version(change.removed_in)
        if removed:
            assert change.old not in flags, (change.old, release["release"])
        elif version >= _version(change.since):  # the deprecation window: both spellings
            assert change.old in flags, (change.old, release["release"])


KNOB_VALUES: dict[str, Any] = {
    "memory_fraction": 0.85,
    "max_running": 128,
    "batched_tokens": 4096,
    "context_len": 8192,
    "cuda_graph_max_bs": 256,
    "block_size": 16,
    "kv_cache_dtype": "fp8_e5m2",
    "prefix_caching": False,
    "enforce_eager": True,
    "tensor_parallel": 2,
    "pipeline_parallel": 1,
    "scheduling_policy": "lpm",
}


@pytest.mark.sim
def test_every_knob_renders_flags_the_release_accepts_in_their_current_spelling(
    release: dict[str, Any], tmp_path: Path
) -> None:
    assert set(KNOB_VALUES) == set(SglangAdapter.knobs)
    adapter, flags = adapter_for(release, tmp_path), set(release["flags"])
    rendered = adapter.to_flags(KNOB_VALUES)
    adapter.validate_flags(rendered)
    argv = adapter.build_launch(rendered, 30000).argv
    assert {a for a in argv if a.startswith("--")} <= flags
    deprecated = {c.old for c in FLAG_CHANGES if c.new in flags}
    assert not deprecated & set(rendered), f"SGLang {release['release']} was given a deprecated spelling"


# -------------------------------------------------------------------------------- readiness
FAKE_SERVER = """
import http.server, json, sys
routes = set(json.loads(sys.argv[2]))
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if "GET " + self.path in routes else 404)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.sim
def test_readiness_is_polled_on_a_route_the_release_serves(release: dict[str, Any], tmp_path: Path) -> None:
    spec = adapter_for(release, tmp_path).build_launch({}, free_port())
    argv = [sys.executable, "-c", FAKE_SERVER, str(spec.port), json.dumps(release["routes"])]
    fallback = spec.base_url + spec.ready_fallback if spec.ready_fallback else None
    proc = EngineProcess(
        argv,
        {},
        tmp_path / "engine.log",
        ready_url=spec.base_url + spec.ready_path,
        ready_fallback_url=fallback,
        startup_timeout_s=30,
    )
    with proc:
        proc.wait_ready()
        route = "GET " + proc.ready_url.removeprefix(spec.base_url)
    assert route in release["routes"]
    assert route != "GET /v1/models"  # answers before warm-up


# ------------------------------------------------------------------------------- log lines
SIZES = [1, 2, 4, 8, 16, 24, 32]
# Sample values for the expressions in the format strings, looked up by the longest key that
# occurs in the expression's source; numbers the tests check are chosen to be distinct.
SAMPLES: dict[str, Any] = {
    "capture_name": "target decode",
    "cache_name": "KV Cache",
    "graph_backend": "CUDA graph",
    "capture_bs": SIZES,
    "capture_num_tokens": [512, 1024],
    "num_tokens_per": 1,
    "backend": "full",
    "iter_msg": " [4242]",
    "num_running_reqs": 5,
    "token_usage_msg": "#token: 1000, token usage: 0.25, ",
    "dtype": "torch.bfloat16",
    "num_tokens": 123456,
    "k_size_GB": 1.5,
    "v_size_GB": 1.5,
    "kv_size_GB": 3.0,
    "max_total_num_tokens": 123456,
    "max_running_requests": 40,
    "chunked_prefill_size": 8192,
    "max_prefill_tokens": 16384,
    "context_len": 32768,
    "mem": 9.5,
    "elapsed": 8.7,
    "perf_counter": 8.7,
    "capture_time": 8.7,
}


def _sample(expr: ast.expr) -> Any:
    if isinstance(expr, ast.IfExp):  # ('VA upper bound' if post_capture else 'is allocated'): the usual branch
        return _sample(expr.orelse)
    if isinstance(expr, ast.Constant):
        return expr.value
    source = ast.unparse(expr)
    keys = [k for k in SAMPLES if k in source]
    return SAMPLES[max(keys, key=len)] if keys else 7


def render(fmt: str, percent_args: tuple[Any, ...] = ()) -> str:
    """One line from a release's format string: an f-string's source, or a %-format."""
    node = ast.parse(fmt, mode="eval").body
    if isinstance(node, ast.Constant):
        return str(node.value) % percent_args if percent_args else str(node.value)
    assert isinstance(node, ast.JoinedStr), fmt
    out = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            out.append(str(part.value))
            continue
        assert isinstance(part, ast.FormattedValue)
        value = _sample(part.value)
        if part.conversion == ord("r"):
            value = repr(value)
        spec = "".join(str(c.value) for c in getattr(part.format_spec, "values", []) if isinstance(c, ast.Constant))
        out.append(format(value, spec))
    return "".join(out)


def formats(release: dict[str, Any], key: str) -> list[str]:
    return [f["format"] for f in release["log_formats"][key]]


def parsed(adapter: SglangAdapter, lines: list[str]) -> list[LogEvent]:
    return [e for e in map(adapter.parse_log_line, lines) if e is not None]


def test_captured_decode_sizes_are_read_wherever_the_release_logs_them(release: dict[str, Any], tmp_path: Path) -> None:
    adapter = adapter_for(release, tmp_path)
    lines = [render(f) for key in ("capture_bs", "capture_begin", "capture_end") for f in formats(release, key)]
    facts = adapter.engine_facts(parsed(adapter, lines), {}, {})
    assert facts.get("cuda_graph_max_bs") == max(SIZES), lines


def test_decode_batch_lines_are_read_with_the_iteration_counter(release: dict[str, Any], tmp_path: Path) -> None:
    adapter = adapter_for(release, tmp_path)
    (fmt,) = formats(release, "decode_batch")
    event = adapter.parse_log_line(render(fmt) + "cuda graph: True, gen throughput (token/s): 812.50, #queue-req: 3")
    assert event is not None and event.kind == EventKind.DECODE_BATCH
    assert (event.data["running"], event.data["token_usage"], event.data["queue"]) == (5, 0.25, 3)


def test_kv_pool_lines_give_the_pool(release: dict[str, Any], tmp_path: Path) -> None:
    adapter = adapter_for(release, tmp_path)
    (summary,) = formats(release, "kv_summary")
    facts = adapter.engine_facts(parsed(adapter, [render(summary)]), {}, {})
    assert (facts["kv_tokens"], facts["max_concurrency"], facts["context_len"]) == (123456, 40, 32768)
    pools = [f for f in formats(release, "kv_allocated") if "draft" not in f and "skipped" not in f]
    assert pools
    for fmt in pools:
        line = render(fmt, ("torch.bfloat16", 123456, 3.0, 9.5)[: fmt.count("%")])
        event = adapter.parse_log_line(line)
        assert event is not None and event.kind == EventKind.KV_CAPACITY and event.data["kv_tokens"] == 123456, line
    for fmt in formats(release, "kv_allocated"):
        if "draft" in fmt:  # the draft model's pool is not the target's
            event = adapter.parse_log_line(render(fmt, ("torch.bfloat16", 999, 0.1)))
            assert event is None or "kv_tokens" not in event.data


def test_a_lowered_running_cap_is_recorded_as_the_value_the_engine_used(
    release: dict[str, Any], tmp_path: Path
) -> None:
    found = formats(release, "max_running_reduced")
    if not found:
        assert _version(release["release"]) < (0, 5, 15)  # older releases lower it without a word
        return
    adapter = adapter_for(release, tmp_path)
    facts = adapter.engine_facts(parsed(adapter, [render(found[0], (64, 40))]), {}, {})
    assert facts["reduced_flags"] == {"--max-running-requests": {"requested": 64, "used": 40}}
    assert facts["max_concurrency"] == 40


def test_retraction_and_ready_lines_are_recognised(release: dict[str, Any], tmp_path: Path) -> None:
    adapter = adapter_for(release, tmp_path)
    (retract,) = formats(release, "retract")
    event = adapter.parse_log_line(render(retract) + "#retracted_reqs: 3, #new_tokens_gained: 512")
    assert event is not None and event.kind == EventKind.PREEMPTION and event.data["retracted"] == 3
    ready = formats(release, "ready")
    assert ready and all(adapter.parse_log_line(render(f)).kind == EventKind.READY for f in ready)  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------- metrics
READ_METRICS = (
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:num_aborted_requests_total",
    "sglang:num_retracted_requests_total",
    "sglang:num_retracted_input_tokens_total",
    "sglang:cuda_graph_passes_total",
    "sglang:max_total_num_tokens",
)


def test_the_metrics_the_adapter_reads_exist(release: dict[str, Any]) -> None:
    assert set(READ_METRICS) <= set(release["metrics"])


def test_graph_coverage_comes_from_the_pass_counter() -> None:
    name = 'sglang:cuda_graph_passes_total{{mode="{}",tp_rank="0"}}'
    before = {name.format("decode_cuda_graph"): 100.0, name.format("decode_none"): 10.0}
    after = {
        name.format("decode_cuda_graph"): 460.0,
        name.format("decode_none"): 50.0,
        name.format("prefill_none"): 9.0,
    }
    facts = SglangAdapter(EngineSettings(kind="sglang", model="m")).engine_facts([], before, after)
    assert facts["decode_passes"] == 400 and facts["cuda_graph_false_share"] == 0.1


# ------------------------------------------------------------------------- the simulator
@pytest.mark.parametrize("version", sorted(SIM_RELEASES, key=_version))
def test_the_simulated_release_serves_and_prints_what_the_real_one_does(version: str) -> None:
    real, sim = RELEASES[version], SIM_RELEASES[version]
    flags = set(real["flags"])
    assert sim.per_phase_graphs is ("--cuda-graph-max-bs-decode" in flags)
    assert sim.graph_aliases is (sim.per_phase_graphs and "--cuda-graph-max-bs" in flags)
    assert sim.attn_dp_size is ("--attn-dp-size" in flags)
    assert sim.ready_route is ("GET /ready" in real["routes"])
    assert {"bs_line": "own line", "begin": "begin line", "end": "end line"}[sim.sizes_on] == MATRIX._sizes_logged_on(
        real["log_formats"]
    )
    assert sim.logs_reduced_cap is bool(real["log_formats"]["max_running_reduced"])


def test_the_docs_table_is_made_from_the_fixtures() -> None:
    assert MATRIX.table(FIXTURES) in (ROOT / "docs" / "sglang.md").read_text()
