"""The ``autotune`` command run as a user runs it: a subprocess in a folder, its output captured;
no run may end in a traceback, whatever its exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

AUTOTUNE = str(Path(sys.executable).parent / "autotune")


def run_cli(cwd: Path, *args: str, columns: int = 80) -> subprocess.CompletedProcess[str]:
    """``autotune *args`` in ``cwd`` on a terminal ``columns`` wide."""
    proc = subprocess.run(
        [AUTOTUNE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "COLUMNS": str(columns)},
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return proc
