"""The validated error band per kind of number, over every validation row of that kind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autotune_sim.fidelity import CATEGORIES, VALIDATION, error_band


def test_band_is_the_worst_row_known_misses_included() -> None:
    for category in CATEGORIES:
        errors = [abs(f.ratio() - 1) for f in VALIDATION if f.category == category]
        band = error_band(category)
        assert band.rows == len(errors)
        assert band.max_abs_error == (max(errors) if errors else None)
    # The KV rows hold a known miss of −35 %: it widens the KV band, as any row the model misses.
    miss = next(f for f in VALIDATION if f.category == "kv" and f.known_miss)
    kv = error_band("kv")
    assert kv.max_abs_error is not None and kv.max_abs_error >= abs(miss.ratio() - 1) > 0.25


def test_a_kind_no_published_row_measures_is_not_validated() -> None:
    assert error_band("throughput-load").rows > 0  # rows under load exist since 2026-12-07
    without = tuple(f for f in VALIDATION if f.category != "throughput-load")
    band = error_band("throughput-load", without)
    assert band.max_abs_error is None and band.rows == 0


def test_an_unknown_category_is_one_line() -> None:
    with pytest.raises(ValueError, match="unknown fidelity category 'speed'; known: kv, memory"):
        error_band("speed")


@pytest.mark.sim
def test_the_command_prints_the_same_bands_as_json() -> None:
    proc = subprocess.run([sys.executable, "-m", "autotune_sim", "error-bands"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert set(data) == set(CATEGORIES)
    assert data["kv"]["max_abs_error"] == error_band("kv").max_abs_error
    assert data["throughput-load"] == {
        "label": "output throughput under load",
        "max_abs_error": error_band("throughput-load").max_abs_error,
        "rows": error_band("throughput-load").rows,
    }
