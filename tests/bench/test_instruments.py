"""The engines' own benchmark clients: workload translation, result parsing, failures."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from autotune.bench.instruments import client_argv, parse_result, run_engine_client
from autotune.config import Workload, parse_model
from autotune.errors import BenchmarkError, ConfigError

BASE = {
    "dataset": {"input_len": 1000, "output_len": 200, "range_ratio": 0.2},
    "num_prompts": 50,
    "warmup_requests": 2,
    "arrival": {"request_rate": 4, "burstiness": 0.5, "concurrency": 8},
    "seed": 3,
    "slos": {"p95_ttft_ms": 1000, "p99_ttft_ms": 2000, "p95_itl_ms": 50, "mean_tpot_ms": 40},
}


def _workload(**over: Any) -> Workload:
    return parse_model(Workload, {**BASE, **over}, "test")


def _opt(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_vllm_bench_gets_the_workload_options(tmp_path: Path) -> None:
    argv = client_argv("vllm-bench", "py", "http://h:1", "/m", _workload(), tmp_path)
    expected = {
        "--random-input-len": "1000",
        "--random-output-len": "200",
        "--random-range-ratio": "0.2",
        "--num-prompts": "50",
        "--request-rate": "4",
        "--burstiness": "0.5",
        "--max-concurrency": "8",
        "--seed": "3",
        "--tokenizer": "/m",
        "--percentile-metrics": "ttft,tpot,itl,e2el",
        "--metric-percentiles": "50,90,95,99",
        "--result-dir": str(tmp_path),
    }
    assert {flag: _opt(argv, flag) for flag in expected} == expected
    assert "--ignore-eos" in argv and "--save-result" in argv
    # goodput takes per-request bounds on ttft/tpot/e2el: the tightest SLO of each, no ITL
    goodput = argv[argv.index("--goodput") + 1 :]
    assert sorted(goodput) == ["tpot:40", "ttft:1000"]


def test_sglang_bench_range_ratio_is_translated(tmp_path: Path) -> None:
    # vLLM's U[800, 1200] is SGLang's U[L·r, L] with L = 1200, r = 800/1200.
    w = _workload(arrival={"request_rate": 4}, slos={})
    argv = client_argv("sglang-bench", "py", "http://h:1", "/m", w, tmp_path)
    assert _opt(argv, "--random-input-len") == "1200"
    assert float(_opt(argv, "--random-range-ratio")) == pytest.approx(800 / 1200)
    assert argv[1:3] == ["-m", "sglang.bench_serving"]


def test_sglang_bench_fixed_lengths_use_ratio_one(tmp_path: Path) -> None:
    w = _workload(dataset={"input_len": 1024, "output_len": 256}, arrival={}, slos={})
    argv = client_argv("sglang-bench", "py", "http://h:1", "/m", w, tmp_path)
    assert (_opt(argv, "--random-input-len"), _opt(argv, "--random-range-ratio")) == ("1024", "1")


@pytest.mark.parametrize(
    ("kind", "over"),
    [
        ("vllm-bench", {"dataset": {"kind": "multi_turn", "turns": 3}}),
        ("sglang-bench", {}),  # burstiness 0.5 has no SGLang equivalent
        ("vllm-bench", {"dataset": {"input": {"dist": "lognormal", "median": 100, "sigma": 1}}}),
    ],
)
def test_workloads_a_client_cannot_express_are_config_errors(kind: str, over: dict[str, Any], tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        client_argv(kind, "py", "http://h:1", "/m", _workload(**over), tmp_path)


def test_sglang_result_names_are_ours(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    old = {"num_prompts": 10, "completed": 10, "output_throughput": 1.0}
    new = {"num_prompts": 10, "completed": 9, "output_throughput": 5.0, "p99_e2e_latency_ms": 7.0, "backend": "x"}
    path.write_text(json.dumps(old) + "\n" + json.dumps(new) + "\n")
    out = parse_result("sglang-bench", path)
    assert out["output_throughput"] == 5.0  # the last line is this run
    assert out["p99_e2el_ms"] == 7.0
    assert out["error_rate"] == pytest.approx(0.1)
    assert "backend" not in out


FAKE_CLIENT = """#!{python}
import json, sys
args = sys.argv[1:]
out = args[args.index("--result-dir") + 1] + "/" + args[args.index("--result-filename") + 1]
json.dump({{"num_prompts": 50, "completed": 50, "output_throughput": 123.0, "p95_ttft_ms": 9.5, "request_rate": "inf"}},
          open(out, "w"))
"""


@pytest.mark.sim
def test_run_engine_client_returns_the_saved_metrics(tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text(FAKE_CLIENT.format(python=sys.executable))
    fake.chmod(0o755)
    out = run_engine_client("vllm-bench", str(fake), "http://h:1", "/m", _workload(), tmp_path / "run")
    assert out == {"num_prompts": 50.0, "completed": 50.0, "output_throughput": 123.0, "p95_ttft_ms": 9.5,
                   "error_rate": 0.0}  # fmt: skip


@pytest.mark.sim
def test_a_failing_client_is_one_line_benchmark_error(tmp_path: Path) -> None:
    # This venv has no vLLM: the client's import fails.
    with pytest.raises(BenchmarkError) as err:
        run_engine_client("vllm-bench", sys.executable, "http://h:1", "/m", _workload(), tmp_path)
    assert "vllm-bench failed (exit 1)" in str(err.value) and "\n" not in str(err.value)
