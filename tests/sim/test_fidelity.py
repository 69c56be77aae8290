"""The simulator against published real measurements it was not fitted to, in a validation set
that cannot be shaped after its errors are seen."""

from __future__ import annotations

import dataclasses
import json
import statistics

import pytest

from autotune_sim.fidelity import FITTED, GOAL_BAND, RECORD, VALIDATION, Fact, digest, record_problems, summarise

# The median |error| over every validation row as it stands (known misses included): it may only
# fall. The goal (≤ 10 %, every row within ±25 %) needs the physics the misses point to.
MEDIAN_NOW = 0.037


def test_validation_set_is_sourced_and_apart_from_the_fitted_set() -> None:
    assert len(VALIDATION) >= 30
    for fact in (*VALIDATION, *FITTED):
        assert fact.source and fact.engine and fact.gpu and fact.model and fact.setup
        assert fact.published > 0
    assert all(f.fitted_to is None and f.moved is None for f in VALIDATION), "a fitted fact cannot count as validation"
    assert all(f.fitted_to or f.moved for f in FITTED)


def test_the_sets_keep_their_record() -> None:
    problems = record_problems(json.loads(RECORD.read_text()))
    assert not problems, "\n".join(problems)


def test_a_relabelled_row_breaks_the_record_and_a_later_note_does_not() -> None:
    # The record pins each row's known-miss label word for word: "~5.6 GiB" made "~3.5 GiB"
    # after the row's error was known is an edit. What a later change says goes beside it.
    record = json.loads(RECORD.read_text())
    labelled = next(f for f in VALIDATION if f.known_miss)
    relabelled = dataclasses.replace(labelled, known_miss=labelled.known_miss + " (relabelled)")
    assert digest(relabelled) != digest(labelled) and digest(labelled) in record["validation"]
    assert digest(dataclasses.replace(labelled, later="a later model change says this")) == digest(labelled)
    unlabelled = dataclasses.replace(labelled, known_miss=None)
    assert digest(unlabelled) not in record["validation"]


def test_an_edited_or_relabelled_row_breaks_the_record() -> None:
    record = json.loads(RECORD.read_text())
    key, label = next(iter(record["validation"].items()))
    assert record_problems({**record, "validation": {**record["validation"], key + "0": label}})
    # A row that left for the fitted set may not come back.
    moved = next(iter(record["fitted"]))
    validation_key = next(k for k in record["validation"] if k != moved)
    assert record_problems({**record, "fitted": {validation_key: "back"}})


@pytest.mark.parametrize(
    "fact", [f for f in VALIDATION if f.known_miss is None], ids=lambda f: f"{f.category}:{f.name}"
)
def test_a_row_not_labelled_a_miss_stays_within_band(fact: Fact) -> None:
    ratio = fact.ratio()
    assert abs(ratio - 1.0) <= GOAL_BAND, f"{fact.name} ({fact.source}): modelled/published = {ratio:.2f}"


def test_the_median_is_over_every_row_and_does_not_grow() -> None:
    summary = summarise()
    assert summary.median_abs_error == statistics.median(abs(f.ratio() - 1.0) for f in VALIDATION)
    assert summary.median_abs_error <= MEDIAN_NOW, f"median |error| {summary.median_abs_error:.1%}"
    # Every row labelled a miss when recorded is listed, as a miss still or as one the model now meets.
    labelled = sorted(id(f) for f in VALIDATION if f.known_miss is not None)
    assert sorted(id(f) for f, _ in summary.known_misses + summary.recovered) == labelled
    assert all(abs(e) > GOAL_BAND for _, e in summary.known_misses)
    assert all(abs(e) <= GOAL_BAND for _, e in summary.recovered)


@pytest.mark.parametrize("fact", [f for f in FITTED if f.moved is None], ids=lambda f: f"{f.category}:{f.name}")
def test_fitted_facts_still_hold(fact: Fact) -> None:
    assert abs(fact.ratio() - 1.0) <= 0.10
