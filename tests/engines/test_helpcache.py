"""An engine's --help is read once per install: again after any package there changes, never
for a launch command, and never kept when it failed."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from autotune.config import EngineSettings
from autotune.engines.vllm import VllmAdapter
from autotune.errors import InvalidFlags

HELP = "usage: api_server [-h]\n  --max-num-seqs MAX_NUM_SEQS\n  --enforce-eager\n"


@pytest.fixture
def venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "vllm-0.32.0.dist-info").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir()
    python.write_text("#!/bin/sh\n")  # never run: subprocess.run is counted instead
    python.chmod(0o755)
    return tmp_path / "venv"


@dataclass
class Runs:
    """Every --help the adapters ran, and the exit code the next one gets."""

    argvs: list[list[str]] = field(default_factory=list)
    code: int = 0


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Runs:
    made = Runs()

    def fake_run(argv: list[str], **_: Any) -> subprocess.CompletedProcess[str]:
        made.argvs.append(argv)
        return subprocess.CompletedProcess(argv, made.code, HELP, "boom: no module named vllm\n")

    monkeypatch.setattr("autotune.engines.base.subprocess.run", fake_run)
    return made


def _flags(**settings: Any) -> frozenset[str]:
    return frozenset(VllmAdapter(EngineSettings(kind="vllm", model="m", **settings)).discover_flags().flags)


def test_a_second_adapter_of_the_same_install_reads_the_kept_help(venv: Path, runs: Runs) -> None:
    python = str(venv / "bin" / "python")
    assert "--max-num-seqs" in _flags(python=python)
    assert _flags(python=python) == _flags(python=python)
    assert len(runs.argvs) == 1
    assert runs.argvs[0][:3] == [python, "-m", "vllm.entrypoints.openai.api_server"]


def test_an_upgrade_reads_the_help_again(venv: Path, runs: Runs) -> None:
    python = str(venv / "bin" / "python")
    _flags(python=python)
    site = venv / "lib" / "python3.11" / "site-packages"
    (site / "vllm-0.32.0.dist-info").rmdir()
    (site / "vllm-0.33.0.dist-info").mkdir()
    _flags(python=python)
    assert len(runs.argvs) == 2


def test_a_launch_command_is_read_every_time(venv: Path, runs: Runs) -> None:
    command = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    _flags(command=command)
    _flags(command=command)
    assert len(runs.argvs) == 2


def test_a_failed_help_is_not_kept(venv: Path, runs: Runs) -> None:
    python = str(venv / "bin" / "python")
    runs.code = 1
    with pytest.raises(InvalidFlags, match="no module named vllm"):
        _flags(python=python)
    runs.code = 0
    assert "--enforce-eager" in _flags(python=python)
    assert len(runs.argvs) == 2
