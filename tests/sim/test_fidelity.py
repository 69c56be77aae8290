"""The simulator against published real measurements it was not fitted to."""

from __future__ import annotations

import pytest

from autotune_sim.fidelity import FITTED, GOAL_BAND, GOAL_MEDIAN, VALIDATION, Fact, summarise


def test_validation_set_is_large_and_sourced() -> None:
    assert len(VALIDATION) >= 20
    for fact in (*VALIDATION, *FITTED):
        assert fact.source and fact.engine and fact.gpu and fact.model and fact.setup
        assert fact.published > 0
    assert all(f.fitted_to is None for f in VALIDATION), "a fitted fact cannot count as validation"
    assert all(f.fitted_to for f in FITTED)


@pytest.mark.parametrize(
    "fact", [f for f in VALIDATION if f.known_miss is None], ids=lambda f: f"{f.category}:{f.name}"
)
def test_validation_row_within_band(fact: Fact) -> None:
    ratio = fact.ratio()
    assert abs(ratio - 1.0) <= GOAL_BAND, f"{fact.name} ({fact.source}): modelled/published = {ratio:.2f}"


def test_median_error_within_goal() -> None:
    summary = summarise()
    assert summary.median_abs_error <= GOAL_MEDIAN, f"median |error| {summary.median_abs_error:.1%}"


@pytest.mark.parametrize("fact", FITTED, ids=lambda f: f"{f.category}:{f.name}")
def test_fitted_facts_still_hold(fact: Fact) -> None:
    assert abs(fact.ratio() - 1.0) <= 0.10
