"""The validated error band per kind of number, from the validation set's rows that are not known misses."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotune_sim.fidelity import CATEGORIES, VALIDATION, error_band


def test_band_is_the_worst_row_that_is_not_a_known_miss() -> None:
    for category in CATEGORIES:
        kept = [abs(f.ratio() - 1) for f in VALIDATION if f.category == category and f.known_miss is None]
        band = error_band(category)
        assert band.rows == len(kept)
        assert band.max_abs_error == (max(kept) if kept else None)
    # The KV rows include a known miss of −35 %; it is listed with its reason, not in the band.
    kv = error_band("kv")
    assert kv.max_abs_error is not None and kv.max_abs_error < 0.25


def test_a_category_with_only_known_misses_has_no_band() -> None:
    assert error_band("moe").max_abs_error is None and error_band("moe").rows == 0


def test_an_unknown_category_is_one_line() -> None:
    with pytest.raises(ValueError, match="unknown fidelity category 'speed'; known: kv, memory"):
        error_band("speed")


@pytest.mark.sim
def test_the_command_prints_the_same_bands_as_json() -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune_sim", "error-bands"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == set(CATEGORIES)
    assert data["decode"]["max_abs_error"] == error_band("decode").max_abs_error
