"""An exported launch read back: what ``autotune export`` writes (bash, json, yaml) gives the
engine, the model, the flags and the variables again, so ``recheck --script`` can take it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.errors import ConfigError
from autotune.report.export import LaunchRecord, render
from autotune.report.exported import read_exported

ARGV = [
    "/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/my llama",
    "--host", "0.0.0.0", "--port", "41234", "--enforce-eager", "--no-enable-prefix-caching",
    "--max-num-seqs", "64", "--gpu-memory-utilization", "0.9", "--speculative-config", '{"method":"ngram"}',
    "--api-key", "a", "b", "--dtype", "float32",
]  # fmt: skip
FLAGS = {
    "--enforce-eager": True,
    "--enable-prefix-caching": False,
    "--max-num-seqs": 64,
    "--gpu-memory-utilization": 0.9,
    "--speculative-config": {"method": "ngram"},
    "--api-key": ["a", "b"],
    "--dtype": "float32",
}


@pytest.mark.parametrize("fmt", ["bash", "json", "yaml"])
def test_every_export_format_reads_back_to_its_launch(fmt: str, tmp_path: Path) -> None:
    record = LaunchRecord(study="s", trial=3, argv=ARGV, env={"VLLM_CPU_KVCACHE_SPACE": "1", "X": "a b$c"})
    suffix, text = render(record, fmt)
    path = tmp_path / f"launch{suffix}"
    path.write_text(text)
    launch = read_exported(path)
    assert (launch.kind, launch.model, launch.flags) == ("vllm", "/models/my llama", FLAGS)
    assert launch.env == {"VLLM_CPU_KVCACHE_SPACE": "1", "X": "a b$c"}


def test_an_sglang_launch_and_a_vllm_serve_command_are_told_apart(tmp_path: Path) -> None:
    sglang = tmp_path / "sglang.json"
    sglang.write_text('{"argv": ["python3", "-m", "sglang.launch_server", "--model-path", "m", "--tp", "2"]}')
    assert (read_exported(sglang).kind, read_exported(sglang).flags) == ("sglang", {"--tp": 2})
    serve = tmp_path / "serve.sh"
    serve.write_text("#!/usr/bin/env bash\nexec vllm serve org/model \\\n  --max-num-seqs 8\n")
    assert (read_exported(serve).model, read_exported(serve).flags) == ("org/model", {"--max-num-seqs": 8})


def test_a_file_that_is_no_export_is_one_line_naming_it(tmp_path: Path) -> None:
    notes = tmp_path / "notes.sh"
    notes.write_text("echo hello\n")
    with pytest.raises(
        ConfigError, match=r"^--script .*notes\.sh: no `exec` line; give a script `autotune export` wrote$"
    ):
        read_exported(notes)
    other = tmp_path / "other.json"
    other.write_text('{"argv": ["python3", "-m", "http.server"]}')
    with pytest.raises(ConfigError, match=r"runs no engine module autotune knows \(python3 -m http.server …\)"):
        read_exported(other)
    with pytest.raises(ConfigError, match=r"^--script .*missing\.sh: cannot read it"):
        read_exported(tmp_path / "missing.sh")
