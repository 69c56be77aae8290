"""The winner's gain over the engine's defaults is a paired comparison, and the study says when
that gain is within the measured noise."""

from __future__ import annotations

from typing import Any

import pytest
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.search.verdict import paired_gains, paired_verdict


def _run(value: float | None, outcome: str = "ok") -> FrozenTrial:
    attrs: dict[str, Any] = {"outcome": outcome, "constraints": {}}
    if value is None:
        return create_trial(state=TrialState.FAIL, user_attrs=attrs)
    return create_trial(value=value, user_attrs=attrs)


def test_gains_pair_run_i_of_the_defaults_with_run_i_of_the_winner() -> None:
    defaults = [_run(100.0), _run(50.0), _run(100.0)]
    winner = [_run(110.0), _run(55.0), _run(None, "crash")]
    assert paired_gains(defaults, winner, 1.0) == pytest.approx([0.10, 0.10])
    # Lower is better (a latency objective): 90 ms against 100 ms is a 10 % gain.
    assert paired_gains([_run(100.0)], [_run(90.0)], -1.0) == pytest.approx([0.10])


def test_a_gain_whose_range_excludes_zero_beats_the_defaults() -> None:
    verdict = paired_verdict(4, [0.05, 0.08, 0.11])
    assert verdict["beats_defaults"] is True
    assert verdict["line"] == "gain over the engine's defaults +8.0% (range +5.0% … +11.0% over 3 paired runs)"


def test_a_gain_within_noise_is_said_to_be_within_noise() -> None:
    verdict = paired_verdict(4, [0.05, -0.02, 0.09])
    assert verdict["beats_defaults"] is False
    assert verdict["line"].startswith("no candidate beat the engine's defaults beyond the measured noise of ±5.5%")


def test_one_pair_has_no_measured_noise_and_the_defaults_winning_is_said() -> None:
    assert paired_verdict(4, [0.3])["beats_defaults"] is None
    assert "noise is not measured" in paired_verdict(4, [0.3])["line"]
    assert paired_verdict(0, [], winner_is_defaults=True)["line"].startswith("the engine's defaults won")
    assert paired_verdict(4, [])["beats_defaults"] is None
