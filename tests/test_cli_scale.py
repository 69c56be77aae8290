"""The scale-out options of the command line: --parallel, --gpus, and `autotune worker`."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import ConfigError
from autotune.options import parse_gpus, parse_parallel
from autotune.runtime import gpu
from autotune.runtime.gpu import FAKE_GPUS_ENV

runner = CliRunner()


def test_parallel_and_gpu_lists_parse() -> None:
    assert parse_parallel("auto") == "auto" and parse_parallel("4") == 4
    assert parse_gpus("0,1,4,5") == [0, 1, 4, 5]
    assert parse_gpus("4-6,0") == [0, 4, 5, 6]
    assert parse_gpus(None) is None


@pytest.mark.sim  # the CLI reads the simulator's error bands (a subprocess) before it checks these
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--parallel", "0"], "--parallel '0' must be auto or a number ≥ 1"),
        (["--parallel", "many"], "--parallel 'many' must be auto or a number ≥ 1"),
        (["--gpus", "a,b"], "--gpus 'a,b': use NVML indices"),
        (["--gpus", ","], "--gpus is empty"),
    ],
)
def test_bad_scale_options_are_one_line_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["tune", "--study", "s", "--results", str(tmp_path), *args])
    assert result.exit_code == 2
    assert message in result.output
    assert not (tmp_path / "s").exists()  # nothing was created


@pytest.mark.sim
def test_gpus_on_a_machine_without_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FAKE_GPUS_ENV, raising=False)
    monkeypatch.setattr(gpu, "_DEFAULT", [None])
    result = runner.invoke(app, ["tune", "--study", "s", "--results", str(tmp_path), "--gpus", "0"])
    assert result.exit_code == 2
    assert "--gpus was given but NVML finds no GPU" in result.output


@pytest.mark.sim
def test_fake_gpu_spec_errors_reach_the_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAKE_GPUS_ENV, "lots of GPUs")
    monkeypatch.setattr(gpu, "_FAKES", {})
    result = runner.invoke(app, ["tune", "--study", "s", "--results", str(tmp_path), "--parallel", "2"])
    assert result.exit_code == 2
    assert f"{FAKE_GPUS_ENV}='lots of GPUs': start with" in result.output


def test_worker_needs_an_existing_autotune_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    missing = runner.invoke(app, ["worker", "--study", "nope", "--storage", url])
    assert missing.exit_code == 1 and "no study named 'nope'" in missing.output
    optuna.create_study(study_name="bare", storage=url)
    bare = runner.invoke(app, ["worker", "--study", "bare", "--storage", url])
    assert bare.exit_code == 1 and "holds no autotune job" in bare.output


def test_bad_fake_spec_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        parse_parallel("-1")
