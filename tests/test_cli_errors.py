"""Bad input: one actionable line naming the file/field/flag, a non-zero exit, no traceback, no
engine started, and an existing study left byte-for-byte as it was."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app

runner = CliRunner()
QUICK_WL = "name: q\ndataset: {input_len: 128, output_len: 16}\nnum_prompts: 8\nwarmup_requests: 0\n"
SPACE = "params:\n  max_running: {type: categorical, choices: [32]}\n"


def _tune(tmp_path: Path, *args: str) -> tuple[int, str]:
    result = runner.invoke(
        app,
        [
            "tune",
            "--study",
            "s",
            "--results",
            str(tmp_path),
            "--engine",
            "sim",
            "--method",
            "search",
            "--trials",
            "1",
            "--finalists",
            "0",
            "--sim-speedup",
            "100",
            *args,
        ],
    )
    return result.exit_code, result.output


def _files(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.fixture
def existing(tmp_path: Path) -> tuple[Path, str]:
    """A study that already has a finished trial, and the hash of its database."""
    code, out = _tune(
        tmp_path, "--workload", _files(tmp_path, "wl.yaml", QUICK_WL), "--space", _files(tmp_path, "space.yaml", SPACE)
    )
    assert code == 0, out
    db = tmp_path / "s" / "study.db"
    return db, hashlib.sha256(db.read_bytes()).hexdigest()


def _one_line_error(out: str) -> str:
    lines = [x for x in out.strip().splitlines() if x.strip()]
    assert "Traceback" not in out
    assert len(lines) == 1 and lines[0].startswith("error:"), out
    return lines[0]


CASES = {
    "malformed-yaml": (["--workload", "@wl", "params:\n  a: b: c\n"], ["wl.yaml", "line"]),
    "unknown-field": (
        ["--space", "@space", "params:\n  max_running: {type: int, low: 1, high: 9, stpe: 2}\n"],
        ["params.max_running.stpe", "unknown field; did you mean step?"],
    ),
    "low-above-high": (
        ["--space", "@space", "params:\n  max_running: {type: int, low: 90, high: 9}\n"],
        ["params.max_running", "swap"],
    ),
    "unknown-flag": (
        ["--space", "@space", "params:\n  max_num_seq: {type: int, low: 8, high: 64}\n"],
        ["--max-num-seq", "did you mean --max-num-seqs"],
    ),
    "bad-storage": (["--storage", "postgresql://u:secret@127.0.0.1:1/nodb"], ["storage", "u:***@"]),
    "context-too-long": (
        [
            "--fixed",
            "context_len=1024",
            "--workload",
            "@wl",
            "name: long\ndataset: {input_len: 4096, output_len: 64}\n",
        ],
        ["4160 tokens", "context"],
    ),
    "bad-duration": (["--time-budget", "8 hours"], ["--time-budget", "8h"]),
}


@pytest.mark.sim
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_one_line_and_touches_nothing(tmp_path: Path, existing: tuple[Path, str], case: str) -> None:
    db, digest = existing
    args, expected = CASES[case]
    resolved: list[str] = []
    for i, a in enumerate(args):
        if a.startswith("@"):
            resolved.append(_files(tmp_path, f"{a[1:]}.yaml", args[i + 1]))
        elif i and args[i - 1].startswith("@"):
            continue
        else:
            resolved.append(a)
    if "--workload" not in resolved:
        resolved += ["--workload", str(tmp_path / "wl.yaml")]
    if "--space" not in resolved:
        resolved += ["--space", str(tmp_path / "space.yaml")]
    code, out = _tune(tmp_path, *resolved)
    assert code != 0
    line = _one_line_error(out)
    for fragment in expected:
        assert fragment in line, line
    assert "secret" not in out
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest
    assert len(list((tmp_path / "s" / "trials").iterdir())) == 3  # baseline, noise, 1 trial: nothing new launched


def test_missing_model_path(tmp_path: Path) -> None:
    result = runner.invoke(app, ["tune", "--engine", "vllm", "--model", "./no/such/model", "--results", str(tmp_path)])
    assert result.exit_code == 2
    assert "no/such/model" in _one_line_error(result.output)


def test_status_of_unknown_study(tmp_path: Path) -> None:
    result = runner.invoke(app, ["status", "nope", "--results", str(tmp_path)])
    assert result.exit_code == 2
    assert "nope" in _one_line_error(result.output)
