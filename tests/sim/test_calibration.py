"""The calibration table (autotune_sim/calibration.py) holds: every modelled number is within the
tolerance of the published fact it is compared with."""

from __future__ import annotations

import pytest

from autotune_sim.calibration import run_checks

CHECKS = run_checks()


@pytest.mark.parametrize("check", CHECKS, ids=[c.name for c in CHECKS])
def test_calibration_check_holds(check) -> None:
    assert check.ok, f"{check.name}: expected {check.expected} ({check.source}), modelled {check.modelled}"
