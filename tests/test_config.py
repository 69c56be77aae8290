"""Config files: valid ones load, every kind of bad input is one line naming file and field."""

from pathlib import Path

import pytest

from autotune.config import SearchSpace, StudySettings, Workload, load_yaml, parse_model
from autotune.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", sorted((ROOT / "search_spaces").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_search_spaces_validate(path: Path) -> None:
    space = load_yaml(path, SearchSpace)
    assert space.params, f"{path.name} tunes nothing"


@pytest.mark.parametrize("path", sorted((ROOT / "workloads").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_workloads_validate(path: Path) -> None:
    workload = load_yaml(path, Workload)
    assert workload.num_prompts > 0


def _error(tmp_path: Path, text: str, model: type = SearchSpace) -> str:
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_yaml(f, model)
    msg = str(info.value)
    assert "\n" not in msg and str(f) in msg
    return msg


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    assert "line 2" in _error(tmp_path, "params:\n  a: b: c\n")


def test_unknown_field_is_named(tmp_path: Path) -> None:
    msg = _error(tmp_path, "params:\n  a:\n    type: int\n    low: 1\n    high: 2\n    hihg: 3\n")
    assert "params.a.hihg" in msg and "unknown field" in msg


def test_a_misspelt_field_gets_the_closest_name_at_its_place(tmp_path: Path) -> None:
    msg = _error(tmp_path, "params:\n  a: {type: int, low: 1, hihg: 3}\n")
    assert msg.endswith("params.a.hihg: unknown field; did you mean high? (+1 more)")
    wl = "name: w\ndataset: {input_len: 8, output_len: 8}\nnum_prompts: 2\n"
    assert _error(tmp_path, wl + "slo: {p95_ttft_ms: 9}\n", Workload).endswith("slo: unknown field; did you mean slos?")
    msg = _error(tmp_path, wl + "arrival: {concurency: 4}\n", Workload)
    assert msg.endswith("arrival.concurency: unknown field; did you mean concurrency?")
    # Through a discriminated length distribution: the misspelling is named, not "sigma: required".
    lognormal = "input: {dist: lognormal, median: 600, sigm: 0.8}"
    msg = _error(tmp_path, wl.replace("input_len: 8", lognormal), Workload)
    assert "dataset.input.sigm: unknown field; did you mean sigma?" in msg
    # Nothing close: no guess.
    assert _error(tmp_path, wl + "zzzzzz: 1\n", Workload).endswith(
        "zzzzzz: unknown field; remove it or check its spelling"
    )


def test_low_above_high_says_swap(tmp_path: Path) -> None:
    msg = _error(tmp_path, "params:\n  a: {type: float, low: 0.9, high: 0.8}\n")
    assert "params.a" in msg and "swap" in msg


def test_condition_must_name_a_param(tmp_path: Path) -> None:
    msg = _error(tmp_path, "params:\n  n: {type: int, low: 1, high: 4, condition: {spec: true}}\n")
    assert "spec" in msg


def test_conditions_in_a_cycle_are_refused(tmp_path: Path) -> None:
    msg = _error(
        tmp_path,
        "params:\n  a: {type: bool, condition: {b: true}}\n  b: {type: bool, condition: {a: true}}\n"
        "  c: {type: int, low: 1, high: 4}\n",
    )
    assert "params a, b name each other in a cycle" in msg


def test_unknown_slo_metric(tmp_path: Path) -> None:
    msg = _error(tmp_path, "slos: {p95_ttfb_ms: 100}\n", Workload)
    assert "p95_ttfb_ms" in msg


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_yaml("/nonexistent/space.yaml", SearchSpace)


def test_top_level_must_be_mapping(tmp_path: Path) -> None:
    assert "mapping" in _error(tmp_path, "- a\n- b\n")


def test_study_name_rejects_path_characters() -> None:
    with pytest.raises(ConfigError, match="name"):
        parse_model(StudySettings, {"name": "../x"}, "tune options")


def test_longest_request_counts_range_and_prefix() -> None:
    w = parse_model(
        Workload, {"dataset": {"input_len": 100, "output_len": 10, "range_ratio": 0.5, "prefix_len": 20}}, "x"
    )
    assert w.longest_request_tokens == 20 + 150 + 15
