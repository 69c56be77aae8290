"""``autotune bench`` errors: one line, the right exit code, no traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["bench", *args])
    return result.exit_code, result.output


@pytest.mark.sim
def test_unreachable_url_is_one_line(tmp_path: Path) -> None:
    w = tmp_path / "w.yaml"
    w.write_text("num_prompts: 1\n")
    code, output = invoke("--url", "http://127.0.0.1:9", "--workload", str(w))
    assert code == 1
    assert output.startswith("error: cannot reach http://127.0.0.1:9/v1/models: ConnectError: ")
    assert output.count("\n") == 1


def test_bad_workload_is_a_config_error(tmp_path: Path) -> None:
    w = tmp_path / "w.yaml"
    w.write_text("dataset: {input: {dist: lognormal, median: 5}}\n")
    code, output = invoke("--url", "http://127.0.0.1:9", "--workload", str(w))
    assert code == 2 and "dataset.input.sigma: Field required" in output and "Traceback" not in output


def test_missing_api_key_variable_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    code, output = invoke("--url", "http://127.0.0.1:9", "--workload", "cpu-quick", "--api-key-env", "NO_SUCH_KEY_VAR")
    assert code == 2 and "NO_SUCH_KEY_VAR" in output


def test_capacity_without_slos_says_what_to_add(tmp_path: Path) -> None:
    w = tmp_path / "w.yaml"
    w.write_text("num_prompts: 1\n")
    code, output = invoke("--url", "http://127.0.0.1:9", "--workload", str(w), "--capacity")
    assert code == 2 and "needs SLOs" in output
