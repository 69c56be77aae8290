"""A live tuner's study, read while the tuner writes it: for tests that act at a known trial."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial


def wait_for_trials(
    tuner: subprocess.Popen[Any],
    results: Path,
    study: str,
    ready: Callable[[list[FrozenTrial]], bool],
    timeout_s: float,
) -> tuple[bool, list[FrozenTrial]]:
    """Poll study ``study`` under ``results`` until ``ready(trials)``, the tuner ends or the time is
    up; returns whether it got ready and the trials last seen (for the test's failure message)."""
    storage = f"sqlite:///{results / study / 'study.db'}"
    deadline = time.monotonic() + timeout_s
    trials: list[FrozenTrial] = []
    while time.monotonic() < deadline and tuner.poll() is None:
        time.sleep(0.5)
        if not (results / study / "manifest.json").exists():
            continue  # the tuner writes it once the study exists: opening the database earlier races its creation
        try:
            trials = optuna.load_study(study_name=study, storage=storage).trials
        except Exception:  # the study may not be readable yet
            continue
        if ready(trials):
            return True, trials
    return False, trials
