"""What the command line makes of the values it is given: environment values verbatim, --fixed
values typed by their flag, search-space values checked against their flag's type, the engine
found from --python/--command — each mistake refused in one line before anything starts."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune import __version__
from autotune.catalog import SHIPPED
from autotune.cli import app
from autotune.config import SearchSpace, load_yaml, parse_model
from autotune.errors import ConfigError
from autotune.jobs import infer_engine
from autotune.options import check_space_values, flag_type, parse_env, typed_fixed

runner = CliRunner()
EMPTY = SearchSpace()


def _one_line_error(output: str) -> str:
    lines = [x for x in output.strip().splitlines() if x.strip()]
    assert "Traceback" not in output
    assert len(lines) == 1 and lines[0].startswith("error:"), output
    return lines[0]


# ---------------------------------------------------------------------------------------- --env
@pytest.mark.parametrize(
    "value",
    ["off", "0755", "[a, b", "@file", "%x", "*glob", "...", "yes", "1e3", "", "a=b", " spaced "],
)
def test_env_values_are_kept_verbatim(value: str) -> None:
    assert parse_env([f"X={value}"]) == {"X": value}


def test_env_from_the_readme_and_odd_values_do_not_crash(tmp_path: Path) -> None:
    # --model is missing for a real engine: the run stops at that line, after --env was read.
    result = runner.invoke(
        app,
        [
            "tune",
            "--engine",
            "vllm",
            "--results",
            str(tmp_path),
            *("--env", "HF_TOKEN_FILE=..."),
            *("--env", "A=[x"),
            *("--env", "B=@y"),
            *("--env", "C=%z"),
            *("--env", "D=*w"),
        ],
    )
    assert "--model is required" in _one_line_error(result.output)


def test_env_name_must_be_a_variable_name() -> None:
    with pytest.raises(ConfigError, match="not an environment variable name"):
        parse_env(["BAD NAME=1"])


# -------------------------------------------------------------------------------------- --fixed
def test_fixed_values_take_their_flag_type() -> None:
    got = typed_fixed(
        "vllm",
        {
            "max_num_seqs": "64",
            "memory_fraction": "0.88",
            "enforce_eager": "true",
            "prefix_caching": "off",
            "dtype": "bfloat16",
            "seed": "0755",  # no type known: kept as written, not read as octal or 755
            "speculative_config": '{"method": "ngram"}',
        },
        EMPTY,
    )
    assert got == {
        "max_num_seqs": 64,
        "memory_fraction": 0.88,
        "enforce_eager": True,
        "prefix_caching": False,
        "dtype": "bfloat16",
        "seed": "0755",
        "speculative_config": {"method": "ngram"},
    }
    assert isinstance(got["max_num_seqs"], int)


@pytest.mark.parametrize(
    ("kind", "pair", "fragments"),
    [
        ("vllm", ("max_num_seqs", "abc"), ["max_num_seqs=abc", "--max-num-seqs", "an integer", "'abc'"]),
        ("vllm", ("max_running", "1.5"), ["--max-num-seqs", "an integer ≥ 1", "'1.5'"]),
        ("vllm", ("max_running", "0"), ["--max-num-seqs", "an integer ≥ 1"]),
        ("vllm", ("memory_fraction", "1.2"), ["--gpu-memory-utilization", "a fraction in (0, 1]", "'1.2'"]),
        ("vllm", ("enforce_eager", "maybe"), ["--enforce-eager", "true or false"]),
        ("sglang", ("tp_size", "two"), ["--tp-size", "an integer"]),
        ("sglang", ("schedule_conservativeness", "-1"), ["--schedule-conservativeness", "a number > 0"]),
    ],
)
def test_fixed_values_of_the_wrong_type_are_one_line(kind: str, pair: tuple[str, str], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        typed_fixed(kind, {pair[0]: pair[1]}, EMPTY)
    message = str(err.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_fixed_value_typed_by_the_space_when_the_flag_is_unknown() -> None:
    space = parse_model(SearchSpace, {"params": {"--long-threshold-x": {"type": "int", "low": 1, "high": 9}}}, "space")
    assert typed_fixed("vllm", {"--long-threshold-x": "4"}, space) == {"--long-threshold-x": 4}
    with pytest.raises(ConfigError, match="an integer"):
        typed_fixed("vllm", {"--long-threshold-x": "four"}, space)


@pytest.mark.sim
def test_bad_fixed_value_launches_nothing(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["tune", "--engine", "sim", "--study", "s", "--results", str(tmp_path), "--fixed", "max_num_seqs=abc"]
    )
    assert result.exit_code == 2
    line = _one_line_error(result.output)
    assert "--max-num-seqs" in line and "'abc'" in line and "integer" in line
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------- space values
def _space(tmp_path: Path, text: str) -> tuple[SearchSpace, str]:
    path = tmp_path / "space.yaml"
    path.write_text(text)
    return load_yaml(path, SearchSpace), str(path)


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        ("params:\n  memory_fraction: {type: float, low: 0.8, high: 1.2}\n", ["params.memory_fraction.high", "1.2"]),
        ("params:\n  max_running: {type: float, low: 8, high: 64}\n", ["params.max_running", "use type: int"]),
        ("params:\n  batched_tokens: {type: categorical, choices: [2048, lots]}\n", ["choices[1]", "'lots'"]),
        ("params:\n  enforce_eager: {type: int, low: 0, high: 1}\n", ["params.enforce_eager", "true or false"]),
        ("fixed:\n  context_len: abc\n", ["fixed.context_len", "--max-model-len", "'abc'"]),
    ],
)
def test_space_values_are_checked_against_their_flag(tmp_path: Path, text: str, fragments: list[str]) -> None:
    space, source = _space(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        check_space_values("vllm", space, source)
    message = str(err.value)
    assert message.startswith(source) and "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.sim
def test_bad_space_value_from_the_command_line_launches_nothing(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text("params:\n  memory_fraction: {type: float, low: 0.8, high: 1.2}\n")
    result = runner.invoke(
        app, ["tune", "--engine", "sim", "--study", "s", "--results", str(tmp_path), "--space", str(space)]
    )
    assert result.exit_code == 2
    assert "params.memory_fraction.high" in _one_line_error(result.output)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("path", sorted((SHIPPED / "search_spaces").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_shipped_space_passes_the_value_checks(path: Path) -> None:
    space = load_yaml(path, SearchSpace)
    kinds = ["vllm", "sglang"] if space.engine == "any" else [space.engine]
    for kind in kinds:
        check_space_values(kind, space, str(path))


def test_knob_and_flag_spellings_share_one_type() -> None:
    assert flag_type("vllm", "max_running") == flag_type("vllm", "max_num_seqs") == flag_type("vllm", "--max-num-seqs")
    assert flag_type("sglang", "max_running")[0] == "--max-running-requests"


# ------------------------------------------------------------------------------- which engine
def _fake_python(tmp_path: Path, modules: list[str]) -> str:
    """A Python whose import path holds empty packages named ``modules`` (stand-ins for engines)."""
    site = tmp_path / "site"
    for name in modules:
        (site / name).mkdir(parents=True, exist_ok=True)
        (site / name / "__init__.py").write_text("raise SystemExit('the tuner must not import me')\n")
    script = tmp_path / "bin" / "python"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


@pytest.mark.sim
def test_engine_is_found_from_the_python_it_runs_under(tmp_path: Path) -> None:
    assert infer_engine(_fake_python(tmp_path / "v", ["vllm"]), None) == "vllm"
    assert infer_engine(_fake_python(tmp_path / "s", ["sglang"]), None) == "sglang"
    with pytest.raises(ConfigError, match="both vllm and sglang; add --engine"):
        infer_engine(_fake_python(tmp_path / "b", ["vllm", "sglang"]), None)
    with pytest.raises(ConfigError, match="imports neither vllm nor sglang"):
        infer_engine(_fake_python(tmp_path / "n", []), None)
    with pytest.raises(ConfigError, match="no such program"):
        infer_engine(str(tmp_path / "missing" / "python"), None)


@pytest.mark.parametrize(
    ("command", "engine"),
    [
        ("vllm serve", "vllm"),
        ("/opt/vllm/bin/vllm serve", "vllm"),
        ("python3 -m sglang.launch_server", "sglang"),
        ("/opt/x/bin/python -m vllm.entrypoints.openai.api_server", "vllm"),
    ],
)
def test_engine_is_found_from_the_command(command: str, engine: str) -> None:
    assert infer_engine(None, command) == engine


def test_a_command_that_names_no_engine_asks_for_one() -> None:
    with pytest.raises(ConfigError, match="add --engine vllm or --engine sglang"):
        infer_engine(None, "./serve.sh --fast")


@pytest.mark.sim
def test_forgetting_engine_with_a_real_python_does_not_run_the_simulator(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, ["vllm"])
    result = runner.invoke(app, ["tune", "--study", "s", "--results", str(tmp_path), "--python", python])
    # vLLM was found there, so it is a real engine: it needs a model (the simulator would not).
    assert result.exit_code == 2
    assert "--model is required for a real engine" in _one_line_error(result.output)
    assert not (tmp_path / "s").exists()


@pytest.mark.sim
def test_a_python_without_an_engine_asks_for_engine(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, [])
    result = runner.invoke(app, ["tune", "--study", "s", "--results", str(tmp_path), "--python", python])
    assert result.exit_code == 2
    assert "--engine" in _one_line_error(result.output)
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------- small options
def test_version_prints_the_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"autotune {__version__}"


def test_flags_are_shown_as_flags_not_values() -> None:
    env = {**os.environ, "COLUMNS": "100"}
    for args in (["--help"], ["export", "--help"], ["report", "--help"]):
        result = runner.invoke(app, args, env=env)
        assert result.exit_code == 0
        assert "<bool>" not in result.output, result.output


@pytest.mark.sim
def test_misspelt_workload_and_space_suggest_the_shipped_name(tmp_path: Path) -> None:
    result = runner.invoke(app, ["tune", "--engine", "sim", "--results", str(tmp_path), "--workload", "chatt"])
    assert result.exit_code == 2
    line = _one_line_error(result.output)
    assert "--workload 'chatt'" in line and "did you mean chat?" in line
    result = runner.invoke(app, ["tune", "--engine", "sim", "--results", str(tmp_path), "--space", "vllm-defualt"])
    assert "did you mean vllm-default?" in _one_line_error(result.output)
