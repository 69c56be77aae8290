"""One live run per local study: a second is refused, the lock is free again once the first ends."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from autotune.errors import StudyError
from autotune.search.studylock import LOCK_FILE, study_lock


def test_a_held_study_is_refused_naming_its_holder(tmp_path: Path) -> None:
    with study_lock(tmp_path, "dup"):
        holder = json.loads((tmp_path / LOCK_FILE).read_text())
        assert holder["pid"] == os.getpid()
        with pytest.raises(StudyError) as refused, study_lock(tmp_path, "dup"):
            pytest.fail("a second holder got the lock")
    message = str(refused.value)
    assert message.startswith(f"study 'dup' is being tuned by another run (pid {os.getpid()} on ")
    assert message.endswith("nothing was changed") and "\n" not in message


def test_the_lock_is_free_after_any_exit(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), study_lock(tmp_path, "s"):
        raise RuntimeError("the run failed")
    with study_lock(tmp_path, "s"):  # taken at once: the kernel released it with the descriptor
        pass
