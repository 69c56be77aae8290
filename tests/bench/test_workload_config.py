"""Workload files: every shipped one loads, every kind of bad input is one line naming the field."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autotune.config import Workload, load_yaml, parse_model
from autotune.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ["chat", "offline-batch", "long-context", "rag-prefix", "multi-turn", "custom", "cpu-quick", "demo-sim"]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_workloads_load_with_their_shapes(name: str) -> None:
    w = load_yaml(ROOT / "workloads" / f"{name}.yaml", Workload)
    assert w.name == name and w.longest_request_tokens > 0
    kinds = {"multi-turn": "multi_turn", "custom": "custom"}
    assert w.dataset.kind == kinds.get(name, "random")
    if name == "rag-prefix":
        assert w.dataset.num_prefixes > 1 and w.warmup_requests >= w.dataset.num_prefixes
    if name == "offline-batch":
        assert math.isinf(w.arrival.request_rate) and not w.slos
    if name in ("chat", "multi-turn", "rag-prefix"):
        assert {"p95_ttft_ms", "p95_tpot_ms"} <= set(w.slos)


def _error(tmp_path: Path, text: str) -> str:
    f = tmp_path / "w.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_yaml(f, Workload)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("dataset: {input: {dist: lognormal, median: 200}}", "dataset.input.sigma: Field required"),
        ("dataset: {input: {dist: gauss}}", "dataset.input:"),
        ("dataset: {input: {dist: empirical, bins: [[20, 10, 1]]}}", "dataset.input.bins.0: low (20) is greater"),
        ("dataset: {input: 100, input_len: 50}", "set either input or input_len"),
        ("dataset: {turns: 3}", "turns only apply to kind: multi_turn"),
        ("dataset: {kind: multi_turn}", "needs turns"),
        ("dataset: {kind: custom}", "needs path"),
        ("dataset: {num_prefixes: 4}", "num_prefixes needs prefix_len"),
        ("arrival: {request_rate: 2, ramp_up: {strategy: linear, start_rps: 1, end_rps: 4}}", "ramp_up replaces"),
        ("arrival: {ramp_up: {strategy: cubic, start_rps: 1, end_rps: 4}}", "arrival.ramp_up.strategy"),
        ("capacity: {rel_tol: 2}", "capacity.rel_tol"),
        ("dataset: {input: {dist: normal, mean: 10, std: 1, min: 50, max: 20}}", "dataset.input: low (50) is greater"),
    ],
)
def test_bad_workloads_name_the_field(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in _error(tmp_path, text + "\n")


def test_custom_path_is_relative_to_the_workload_file(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "p.jsonl").write_text('{"prompt": "hello", "output_tokens": 3}\n\n{"turns": ["a", "b"]}\n')
    f = tmp_path / "w.yaml"
    f.write_text("endpoint: chat\ndataset: {kind: custom, path: data/p.jsonl, output: 10}\n")
    w = load_yaml(f, Workload)
    assert w.dataset.path == (tmp_path / "data" / "p.jsonl").resolve()
    # Bytes of the prompts bound their tokens; plus outputs and the chat template allowance.
    assert w.longest_request_tokens == max(5 + 3 + 16, 2 + 20 + 32)


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("not json", "line 2 is not JSON"),
        ('{"prompt": ""}', "line 2: turns.0.prompt"),
        ('{"prompt": "x", "output_tokens": 0}', "line 2: turns.0.output_tokens"),
        ('{"turns": []}', "line 2: turns"),
        ('{"question": "x"}', "line 2: turns: Field required"),
    ],
)
def test_bad_custom_lines_are_named(tmp_path: Path, line: str, expected: str) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(ConfigError, match=expected):
        parse_model(Workload, {"dataset": {"kind": "custom", "path": str(data)}}, "x")


def test_missing_custom_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the custom dataset"):
        parse_model(Workload, {"dataset": {"kind": "custom", "path": str(tmp_path / "nope.jsonl")}}, "x")


@pytest.mark.parametrize("name", SHIPPED)
def test_peak_dataset_is_the_longest_request_and_fits_it(name: str) -> None:
    w = load_yaml(ROOT / "workloads" / f"{name}.yaml", Workload)
    peak = w.peak_dataset()
    assert peak.kind == "random" and peak.input_dist.low == peak.input_dist.high
    assert peak.output_dist.high == w.dataset.output_dist.high
    total = peak.prefix_len + peak.input_dist.high + peak.output_dist.high
    assert total <= w.longest_request_tokens
    if w.dataset.kind == "random" and w.endpoint == "completions":
        assert total == w.longest_request_tokens
