"""``autotune recheck`` on the simulator: a study tuned on the simulated vLLM 0.32 rechecked on
0.33 (the simulator speaks the release its environment names) — the flag report, the rounds on
fresh engines, the paired verdict, and the updated script or the re-tune command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clirun import run_cli

from autotune.errors import ConfigError
from autotune.jobs import EngineOptions, recheck_engine
from autotune.search.record import trial_record
from autotune.search.storage import default_storage_url, load_study

# 16 streams at once. The study fixes max_running at 4, so its "defaults" (the engine's defaults
# with the study's fixed flags, as every baseline) serve 4 at a time: the tuned 64 is far ahead of
# them (+140 % modelled) and 2 far behind, on every release the simulator speaks.
WORKLOAD = """name: recheck-small
dataset: {input_len: 256, output_len: 32}
num_prompts: 24
warmup_requests: 1
arrival: {concurrency: 16}
slos: {p95_ttft_ms: 60000}
"""
SPACE = """name: two-points
engine: vllm
params:
  max_running: {type: categorical, choices: [2, 64]}
fixed:
  enforce_eager: true
  max_running: 4
"""
NEW = ["--env", "AUTOTUNE_SIM_VLLM_VERSION=0.33.0"]
pytestmark = [pytest.mark.timeout(600), pytest.mark.xdist_group("cli-recheck")]


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(cwd, *args, columns=200)  # wide enough that no line of the report wraps


@pytest.fixture(scope="module")
def tuned(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A finished study on the simulated vLLM 0.32: both points measured, each trial's number."""
    home = tmp_path_factory.mktemp("recheck")
    (home / "w.yaml").write_text(WORKLOAD)
    (home / "s.yaml").write_text(SPACE)
    args = ["tune", "--study", "s", "--engine", "sim", "--space", "s.yaml", "--workload", "w.yaml"]
    args += ["--method", "search", "--trials", "2", "--finalists", "1", "--validation-runs", "1"]
    proc = run(home, *args, "--sim-speedup", "100", "--seed", "0")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    study = load_study("s", default_storage_url(home / "results", "s"))
    by_seqs = {trial_record(t).params.get("max_running"): t.number for t in study.trials if trial_record(t).params}
    return {"home": home, "trial": by_seqs}


def _recheck(tuned: dict[str, Any], seqs: int) -> subprocess.CompletedProcess[str]:
    return run(tuned["home"], "recheck", "s", "--trial", str(tuned["trial"][seqs]), "--rounds", "2", *NEW)


@pytest.mark.sim
def test_flags_that_still_win_get_an_updated_script_from_the_new_release(tuned: dict[str, Any]) -> None:
    proc = _recheck(tuned, 64)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert f"recheck of study s, trial {tuned['trial'][64]}" in out
    assert re.search(r"vLLM 0\.33\.0: (\d+) of \1 flags and variables unchanged; nothing to translate", out), out
    assert "tuned flags on the new release: --max-num-seqs=64" in out
    assert "2 rounds of the new release's defaults beside the tuned flags" in out
    assert "tuned flags of study s, trial" in out
    assert re.search(r"gain over vLLM 0\.33\.0's defaults \+[\d.]+% \(range \+[\d.]+% … \+[\d.]+% over 2 paired", out)
    script = Path(tuned["home"]) / re.search(r"updated launch script: (\S+)", out).group(1)  # type: ignore[union-attr]
    text = script.read_text()
    assert "--max-num-seqs 64" in text and "--enforce-eager" in text
    assert "median of 2 runs" in text  # the script says what the new release measured
    name = f"s-trial{tuned['trial'][64]}-recheck-0.33.0"
    recheck = load_study(name, default_storage_url(Path(tuned["home"]) / "results", name))
    runs = [trial_record(t) for t in recheck.trials]
    assert sorted(str(r.validates) for r in runs) == ["defaults", "defaults", "tuned", "tuned"]
    assert all(r.argv.count("--enforce-eager") == 1 for r in runs)  # the study's fixed flags on both sides
    assert sorted(r.flags["--max-num-seqs"] for r in runs) == [4, 4, 64, 64]

    again = _recheck(tuned, 64)  # the same command resumes: every round is recorded already
    assert again.returncode == 0 and "resuming with 4 trials (validation 4) recorded" in again.stdout, again.stdout
    assert len(load_study(name, default_storage_url(Path(tuned["home"]) / "results", name)).trials) == 4


@pytest.mark.sim
def test_flags_that_lose_on_the_new_release_say_how_to_retune(tuned: dict[str, Any]) -> None:
    proc = _recheck(tuned, 2)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "on vLLM 0.33.0: they did not beat vLLM 0.33.0's defaults beyond the measured noise" in proc.stdout
    retune = re.search(r"^re-tune on vLLM 0\.33\.0: (autotune tune .*)$", proc.stdout, re.MULTILINE)
    assert retune is not None, proc.stdout
    words = retune.group(1).split()
    assert words[:6] == ["autotune", "tune", "--study", "s-0.33.0", "--engine", "sim-vllm"]
    assert "--env=AUTOTUNE_SIM_VLLM_VERSION=0.33.0" in words and "--space" in words


@pytest.mark.sim
def test_a_trial_of_the_defaults_has_nothing_to_recheck(tuned: dict[str, Any]) -> None:
    proc = run(tuned["home"], "recheck", "s", "--trial", "0", *NEW)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "study s, trial 0 ran the engine's defaults: no tuned flag to measure on the new release" in proc.stdout


def test_a_real_study_needs_the_new_release_to_recheck_on() -> None:
    with pytest.raises(ConfigError, match=r"^--python \(or --command\) is required"):
        recheck_engine({"kind": "vllm", "simulated": False}, EngineOptions())
    engine = recheck_engine({"kind": "vllm"}, EngineOptions(python="/opt/new/bin/python", env=["A=1"]))
    assert engine == {"python": "/opt/new/bin/python", "command": None, "env": {"A": "1"}}


@pytest.mark.sim
def test_a_knob_newer_than_the_installed_release_is_left_out_and_said(tmp_path: Path) -> None:
    (tmp_path / "w.yaml").write_text(WORKLOAD)
    args = ["tune", "--study", "old", "--engine", "sim-sglang", "--space", "sglang-features", "--workload", "w.yaml"]
    args += ["--method", "search", "--trials", "1", "--finalists", "0", "--noise-runs", "0", "--sim-speedup", "100"]
    proc = run(tmp_path, *args, "--env", "AUTOTUNE_SIM_SGLANG_VERSION=0.5.9")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (
        "space sglang-features: cuda_graph_backend_prefill left out: SGLang 0.5.9 has no "
        "--cuda-graph-backend-prefill (it arrived in 0.5.15)" in proc.stdout
    )
    study = load_study("old", default_storage_url(tmp_path / "results", "old"))
    assert all("--cuda-graph-backend-prefill" not in trial_record(t).argv for t in study.trials)
    assert "cuda_graph_backend_prefill" not in study.user_attrs["config"]["space"]["params"]


@pytest.mark.sim
def test_an_exported_script_is_rechecked_with_the_workload_and_fixed_flags_given(tuned: dict[str, Any]) -> None:
    home = tuned["home"]
    exported = run(home, "export", "s", "--trial", str(tuned["trial"][64]), "-o", "tuned.sh")
    assert exported.returncode == 0, exported.stderr
    simulator = f"{sys.executable} -m autotune_sim vllm"
    args = ["recheck", "--script", "tuned.sh", "--workload", "w.yaml", "--command", simulator, "--rounds", "2"]
    args += ["--fixed", "enforce_eager=true", "--fixed", "max_running=4", "--env", "AUTOTUNE_SIM_SPEEDUP=100"]
    proc = run(home, *args)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "recheck of script tuned" in out and "tuned flags on the new release: --max-num-seqs=64" in out
    assert "tuned flags of script tuned on vLLM: gain over vLLM's defaults +" in out  # no Python to read a release from
    name = "tuned-recheck-new"
    runs = [trial_record(t) for t in load_study(name, default_storage_url(Path(home) / "results", name)).trials]
    assert sorted(r.flags["--max-num-seqs"] for r in runs) == [4, 4, 64, 64]
    missing = run(home, "recheck", "--script", "tuned.sh", "--command", simulator)
    assert missing.returncode == 2
    assert "--script needs --workload: an exported launch does not say what it was tuned for" in missing.stderr
