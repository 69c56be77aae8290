"""scripts/gpu-acceptance.sh on a machine without an NVIDIA GPU: it says "no GPU" and exits 0.

On a GPU machine run the script itself (see its header); these tests are skipped there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-acceptance.sh"
CHECKS = ("list_gpus", "memory_used_by_pid", "wait_pids_released", "wait_memory_at_most")

pytestmark = [pytest.mark.sim, pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="an NVIDIA GPU is present")]


def run_script(**env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "AUTOTUNE_FAKE_GPUS"}
    environ["PYTHON"] = sys.executable
    environ.update(env)
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, timeout=120, env=environ, check=False)


@pytest.mark.parametrize("fake", [None, "2xH100-80GB"], ids=["plain", "fake-gpus-ignored"])
def test_no_gpu_skips_every_check_and_exits_zero(fake: str | None) -> None:
    result = run_script(**({"AUTOTUNE_FAKE_GPUS": fake} if fake else {}))
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("no GPU") for line in lines), result.stdout
    for check in CHECKS:
        assert f"SKIP {check}: no GPU" in lines
    assert not [line for line in lines if line.startswith(("PASS", "FAIL"))]
    assert lines[-1] == "gpu-acceptance: 0 passed, 0 failed, 4 skipped"


def test_python_without_dependencies_is_an_error(tmp_path: Path) -> None:
    # -I (isolated) hides site-packages, and with it pynvml: the script must say so, not "no GPU".
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -I -S "$@"\n')
    python.chmod(0o755)
    result = run_script(PYTHON=str(python))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "no GPU" not in result.stdout
    assert "nvidia-ml-py" in result.stdout
