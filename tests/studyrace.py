"""Another worker's start record, written at a known moment instead of after a sleep."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from optuna.trial import TrialState


def record_after_first_poll(monkeypatch: pytest.MonkeyPatch, run: Any, write: Callable[[], None]) -> list[int]:
    """Call ``write`` (the other worker's start record) right after ``run``'s first look at the
    running trials has missed it, so the look that follows must wait for and see it. Returns the
    numbers of the running trials each look saw, for the test to check that the wait happened."""
    original = run.study.get_trials
    looks: list[int] = []

    def get_trials(*args: Any, **kwargs: Any) -> Any:
        found = original(*args, **kwargs)
        if kwargs.get("states") == (TrialState.RUNNING,):
            looks.append(len(found))
            if len(looks) == 1:
                write()
        return found

    monkeypatch.setattr(run.study, "get_trials", get_trials)
    return looks
